"""Handing the API key to Ray actors without writing it into any file.

Ray writes ``runtime_env`` env vars in plain text to its session logs on every node,
and pickles an actor's constructor arguments into the object store, which may spill to
disk. So the key is split in two, neither half saying anything alone: a one-time pad as
long as the key, kept in the job's Redis under a random name (with an expiry), and the
key XOR that pad, which travels with the stage's arguments; an actor recombines them in
memory, and each job start draws a new pad. A Redis URL's password cannot be hidden
the same way (its pad would be behind the very password): its pad goes to Ray's object
store (``ray.put``, in memory on the driver's node) and the URL travels without it
(:class:`MaskedPassword`). :meth:`RayJob.finish` drops both pads.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from provider_router._exceptions import ConfigurationError

__all__ = [
    "PAD_TTL",
    "MaskedKey",
    "MaskedPassword",
    "mask_key",
    "mask_password",
    "split_password",
    "with_password",
]

PAD_TTL: Final = 30 * 24 * 3600
"""Seconds a pad stays in Redis: a lazy dataset may be executed long after it was built."""


class MaskedKey:
    """The key XOR a pad stored in Redis at ``pad_name`` (safe to pickle and log).

    Deliberately not a dataclass: Ray Data's metadata exporter (``export_events``)
    turns a stage's dataclass arguments into dicts with ``dataclasses.asdict``, which
    walks into nested dataclasses past their ``__repr__`` and would write the masked
    half beside the pad's name; a plain object is written as its ``repr``.
    """

    __slots__ = ("_masked", "_pad_name")

    def __init__(self, pad_name: str, masked: bytes) -> None:
        self._pad_name = pad_name
        self._masked = masked

    @property
    def pad_name(self) -> str:
        """Where the pad is kept in Redis."""
        return self._pad_name

    @property
    def masked(self) -> bytes:
        """The key XOR the pad."""
        return self._masked

    def __repr__(self) -> str:
        return f"MaskedKey(pad_name={self.pad_name!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MaskedKey):
            return NotImplemented
        return (self._pad_name, self._masked) == (other._pad_name, other._masked)

    def __hash__(self) -> int:
        return hash((self._pad_name, self._masked))

    def __reduce__(self) -> tuple[type[MaskedKey], tuple[str, bytes]]:
        return (MaskedKey, (self._pad_name, self._masked))

    def unmask(self, pad: bytes | None) -> SecretStr:
        """The key, from the pad read back from Redis."""
        if pad is None or len(pad) != len(self.masked):
            raise ConfigurationError(
                f"the API key's pad {self.pad_name!r} is missing from Redis (expired, or "
                "the keys were deleted): build the job's dataset again with job.generate()"
            )
        return SecretStr(bytes(a ^ b for a, b in zip(self.masked, pad, strict=True)).decode())


def mask_key(key: SecretStr, prefix: str) -> tuple[MaskedKey, bytes]:
    """A new pad for ``key``: ``(the masked key, the pad to store in Redis)``."""
    raw = key.get_secret_value().encode()
    pad = os.urandom(len(raw))
    masked = bytes(a ^ b for a, b in zip(raw, pad, strict=True))
    return MaskedKey(f"{prefix}:pad:{secrets.token_hex(16)}", masked), pad


def split_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password, and the password (None: the URL has none)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = f"{user}@{host}" if user else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)), parts.password


def with_password(url: str, password: str) -> str:
    """``url`` (as :func:`split_password` left it) with ``password`` put back."""
    parts = urlsplit(url)
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


class MaskedPassword:
    """A Redis password XOR a pad kept in Ray's object store (safe to pickle and log).

    Not a dataclass, for the reason :class:`MaskedKey` is not one.
    """

    __slots__ = ("_masked", "_pad")

    def __init__(self, masked: bytes, pad: Any) -> None:
        self._masked = masked
        self._pad = pad
        """The pad's ``ObjectRef``."""

    def __repr__(self) -> str:
        return "MaskedPassword(...)"

    def __reduce__(self) -> tuple[type[MaskedPassword], tuple[bytes, Any]]:
        return (MaskedPassword, (self._masked, self._pad))

    def unmask(self) -> str:
        """The password (reads the pad from the object store: blocking, off the loop)."""
        import ray

        pad = ray.get(self._pad)
        if not isinstance(pad, bytes) or len(pad) != len(self._masked):
            raise ConfigurationError(
                "the Redis password's pad is gone from Ray's object store (the job was "
                "finished): build the job's dataset again with job.generate()"
            )
        return bytes(a ^ b for a, b in zip(self._masked, pad, strict=True)).decode()


def mask_password(password: str) -> tuple[bytes, bytes]:
    """``(password XOR pad, pad)``, a new pad each call."""
    raw = password.encode()
    pad = os.urandom(len(raw))
    return bytes(a ^ b for a, b in zip(raw, pad, strict=True)), pad
