"""Transport: the HTTP client of one origin, its options, deadlines and SSE parsing.

The only folder that catches transport errors (aiohttp's, llhttp's, the socket's)
and maps them onto :mod:`provider_router._exceptions`. ``h1/`` is the lean HTTP/1.1
client underneath (llhttp framing, aiohappyeyeballs address racing, proxies).
"""
