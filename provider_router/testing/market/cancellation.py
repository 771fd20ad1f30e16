"""Which providers stop generating (and billing) when a stream's client goes away.

OpenRouter's streaming guide ("Stream cancellation") lists the providers for which
aborting the connection "immediately stops model processing and billing", and those
for which it does not: the model finishes and the whole response is billed. A
non-streaming request is billed in full whatever the provider. A provider on neither
list is taken not to cancel (an assumption: the cautious reading for money).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "CANCELLATION_MODES",
    "CANCELS",
    "DOES_NOT_CANCEL",
    "CancellationMode",
    "provider_cancels",
]

CancellationMode = Literal["docs", "none", "all"]
"""``docs``: per provider, from the lists below; ``none``: no provider cancels (a
client that leaves pays for the whole generation); ``all``: every provider stops at
once (a stream's client pays the tokens sent, a JSON request's nothing), the
simulator's behaviour before cancellation was per provider."""
CANCELLATION_MODES: Final = ("docs", "none", "all")


def _names(*names: str) -> frozenset[str]:
    return frozenset(map(_normal, names))


def _normal(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


CANCELS: Final = _names(
    "OpenAI", "Azure", "Anthropic", "Fireworks", "Mancer", "Recursal", "AnyScale", "Lepton",
    "OctoAI", "Novita", "DeepInfra", "Together", "Cohere", "Hyperbolic", "Infermatic", "Avian",
    "XAI", "Cloudflare", "SFCompute", "Nineteen", "Liquid", "Friendli", "Chutes", "DeepSeek",
)  # fmt: skip
"""The docs' "Supported" list, normalized (lower case, letters and digits only)."""

DOES_NOT_CANCEL: Final = _names(
    "AWS Bedrock", "Groq", "Modal", "Google", "Google AI Studio", "Minimax", "HuggingFace",
    "Replicate", "Perplexity", "Mistral", "AI21", "Featherless", "Lynn", "Lambda", "Reflection",
    "SambaNova", "Inflection", "ZeroOneAI", "AionLabs", "Alibaba", "Nebius", "Kluster",
    "Targon", "InferenceNet",
)  # fmt: skip
"""The docs' "Not currently supported" list, normalized."""

_SUFFIXES: Final = ("ai", "inc")


def provider_cancels(*names: str) -> bool:
    """Whether a provider known by any of ``names`` (display name, slug, tag) stops
    billing when a stream's client goes away. Neither list: False (an assumption)."""
    for name in names:
        normal = _normal(name)
        if normal in CANCELS:
            return True
        for suffix in _SUFFIXES:  # "Together AI", "NovitaAI": the same providers
            if normal.endswith(suffix) and normal[: -len(suffix)] in CANCELS:
                return True
    return False
