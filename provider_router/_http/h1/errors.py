"""How an exchange on the lean HTTP/1.1 client fails; ``_http/session.py`` maps them.

The classes carry the one fact the money rules need: whether the request may
have reached the server. Only :class:`H1ConnectError` says it did not.
"""

from __future__ import annotations

__all__ = ["H1ConnectError", "H1ConnectTimeout", "H1Error", "H1ReadTimeout"]


class H1Error(Exception):
    """The exchange failed after the request may have reached the server."""


class H1ConnectError(H1Error):
    """The connection could not be opened: the request was provably never sent."""


class H1ConnectTimeout(H1ConnectError, TimeoutError):
    """No connection within the connect timeout (never sent)."""


class H1ReadTimeout(H1Error, TimeoutError):
    """Nothing arrived for the read (idle) timeout: the request was sent."""
