"""The simulated account: credits, per-key limits, in-flight holds and exact charges.

All amounts are integer picodollars, so a charge is exact and sums never drift. Before
routing, a request's worst case is computed like OpenRouter's pre-flight check (every
prompt token and ``max_tokens``, or the endpoint's limit, at the primary endpoint's
prices, plus its fee); a key whose remaining limit, or an account whose balance, cannot
cover it gets a 402 with the matching ``limit_source``, and one whose balance covers it
but not on top of the holds of requests in flight gets a transient 402 with a
``Retry-After``. An admitted request holds its worst case until it settles at its
actual cost, so the balance may end slightly negative when a fallback is dearer than
the primary, as on the real service (docs/simulator.md, "Credits and 402").
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from provider_router._money import from_units, to_decimal, to_units
from provider_router.testing.market.listing import EndpointSpec

__all__ = ["Account", "Cost", "KeyState", "PaymentDenied", "compute_cost", "key_hash"]

CREDITS_URL = "https://openrouter.ai/settings/credits"
KEYS_URL = "https://openrouter.ai/settings/keys"
TOP_UP_URL = "https://openrouter.ai/credits"
"""The URL of the "Insufficient credits" 402, as OpenRouter's docs and description show it."""


class Cost(NamedTuple):
    """What one served request costs, in picodollars (``image``: the per-image fees).

    A named tuple (immutable, hashable in C): built on every answer and the key of
    the usage encoder's cache."""

    prompt: int
    completion: int
    request: int
    image: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion + self.request + self.image


def compute_cost(
    endpoint: EndpointSpec,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    cache_write_tokens: int = 0,
    images: int = 0,
) -> Cost:
    """Exact cost: uncached prompt, cached prompt (at the cache-read price when the
    endpoint has one), prompt written to cache (at the cache-write price when it has
    one), completion including reasoning, the per-request fee and the per-image fee of
    each input image (its tokens are already in ``prompt_tokens``)."""
    read_price = endpoint.cache_read_units
    if read_price is None:
        read_price = endpoint.prompt_units
    write_price = endpoint.cache_write_units
    if write_price is None:
        write_price = endpoint.prompt_units
    uncached = prompt_tokens - cached_tokens - cache_write_tokens
    prompt = (
        uncached * endpoint.prompt_units
        + cached_tokens * read_price
        + cache_write_tokens * write_price
    )
    return Cost(
        prompt,
        completion_tokens * endpoint.completion_units,
        endpoint.request_units,
        images * endpoint.image_units,
    )


@dataclass(frozen=True, slots=True)
class PaymentDenied:
    """A refusal for money: which limit, OpenRouter's wording and status (a 402, or
    the field's bare 403 for a key past its limit)."""

    limit_source: str
    message: str
    retry_after: float | None = None
    status: int = 402


class KeyState:
    """One API key: its label, optional limit, usage and holds. Never shows the key.

    Keys made through the management API (``POST /keys``) also carry what that API
    reports: ``hash`` (the id in its paths), ``name``, the masked ``masked_label``,
    ``disabled``, ``expires_at`` (epoch seconds, wall clock) and ``limit_reset``. A
    management key (``management``) may call only that API and ``/key``.
    """

    __slots__ = (
        "created_at",
        "disabled",
        "expires_at",
        "hash",
        "holds",
        "include_byok_in_limit",
        "label",
        "last_used",
        "limit",
        "limit_reset",
        "management",
        "masked_label",
        "name",
        "requests",
        "updated_at",
        "usage",
    )

    def __init__(self, label: str, limit: int | None) -> None:
        self.label = label
        self.limit = limit
        self.usage = 0
        self.holds = 0
        self.requests = 0
        self.hash = ""
        self.name = label
        self.masked_label = label
        self.disabled = False
        self.expires_at: float | None = None
        self.limit_reset: str | None = None
        self.include_byok_in_limit = False
        self.management = False
        self.created_at = 0.0
        self.updated_at: float | None = None
        self.last_used: float | None = None

    def refusal(self, now: float) -> str | None:
        """Why the key is refused at wall-clock time ``now`` (None: it is usable)."""
        if self.disabled:
            return "disabled"
        expires = self.expires_at
        if expires is not None and now >= expires:
            return "expired"
        return None

    def __repr__(self) -> str:
        return f"KeyState(label={self.label!r}, limit={self.limit}, usage={self.usage})"


def key_label(key: str) -> str:
    """A stable, non-secret name for a key: enough to tell keys apart in a log."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def key_hash(key: str) -> str:
    """The management API's id of a key (64 hex digits, as its paths take)."""
    return hashlib.sha256(key.encode()).hexdigest()


def masked(key: str) -> str:
    """A key as the management API's ``label`` shows it (``sk-or-v1-0e6...1c96``)."""
    return f"{key[:12]}...{key[-4:]}" if len(key) > 20 else "sk-...."


class Account:
    """The account balance shared by every key, the keys, and the in-flight holds."""

    def __init__(
        self,
        credits: Decimal | int | str,
        api_keys: Iterable[str] | Mapping[str, Decimal | int | str | None] | None,
        management_keys: Iterable[str] = (),
    ) -> None:
        self.credits = to_units(to_decimal(credits, what="credits"))
        self.usage = 0
        self.holds = 0
        self.key_limit_status = 402
        self.wall_clock: Callable[[], float] = time.time
        """When a charge is recorded (a key's ``last_used_at``): the simulator's."""
        """How a key past its limit is refused: 402 as the docs say, or 403 as the
        field reports (docs/simulator.md, "Billing, credits and 402")."""
        self.revoked: set[str] = set()
        """Hashes of deleted keys: refused even by an account that accepts any key."""
        self.open = api_keys is None
        self.keys: dict[str, KeyState] = {}
        self.by_hash: dict[str, KeyState] = {}
        """Every key by its management-API hash (those made by ``POST /keys`` too)."""
        if api_keys is not None:
            limits = api_keys if isinstance(api_keys, Mapping) else dict.fromkeys(api_keys)
            for key, limit in limits.items():
                if not isinstance(key, str) or not key.strip():
                    raise ValueError("api_keys must be non-empty strings")
                units = None if limit is None else to_units(to_decimal(limit, what="key limit"))
                self.add_key(key, units)
        for key in management_keys:
            if not isinstance(key, str) or not key.strip():
                raise ValueError("management_keys must be non-empty strings")
            self.add_key(key, None).management = True

    def add_key(self, token: str, limit: int | None, *, name: str | None = None) -> KeyState:
        """Accept ``token`` (with a limit in picodollars, or none)."""
        state = KeyState(key_label(token), limit)
        state.hash = key_hash(token)
        state.masked_label = masked(token)
        if name is not None:
            state.name = name
        self.keys[token] = state
        self.by_hash[state.hash] = state
        return state

    @property
    def balance(self) -> int:
        return self.credits - self.usage

    def key(self, token: str) -> KeyState | None:
        """The key for a bearer token, or None when it is not accepted."""
        state = self.keys.get(token)
        if state is None and self.open and token and key_hash(token) not in self.revoked:
            state = self.add_key(token, None)
        return state

    def delete_key(self, state: KeyState) -> None:
        """Forget a key for good (``DELETE /keys/{hash}``)."""
        self.by_hash.pop(state.hash, None)
        self.revoked.add(state.hash)
        for token, known in list(self.keys.items()):
            if known is state:
                del self.keys[token]

    def top_up(self, amount: Decimal | int | str) -> None:
        """Add credits (negative amounts remove them)."""
        self.credits += to_units(to_decimal(amount, what="top-up"))

    def set_credits(self, amount: Decimal | int | str) -> None:
        """Set total credits so that the balance becomes ``amount``."""
        self.credits = self.usage + to_units(to_decimal(amount, what="credits"))

    def check(
        self, key: KeyState, worst: int, max_out: int, fixed: int, completion_unit: int
    ) -> PaymentDenied | None:
        """Whether ``worst`` picodollars can be held for ``key`` (None: yes)."""
        balance = self.credits - self.usage
        if key.limit is None and balance > 0 and worst <= balance and worst <= balance - self.holds:
            return None  # the usual answer, before the refusals are worded

        def affordable(remaining: int) -> int:
            if completion_unit <= 0:
                return max_out
            return max(0, (remaining - fixed) // completion_unit)

        if key.limit is not None:
            remaining = key.limit - key.usage - key.holds
            if worst > remaining and self.key_limit_status == 403:
                window = key.limit_reset or "total"
                return PaymentDenied(
                    "openrouter_key_limit",
                    f"Key limit exceeded ({window} limit). Manage it using {KEYS_URL}",
                    status=403,
                )
            if worst > remaining:
                return PaymentDenied(
                    "openrouter_key_limit",
                    "This request requires more credits, or fewer max_tokens. You requested up "
                    f"to {max_out} tokens, but can only afford {affordable(remaining)}. To "
                    f"increase, visit {KEYS_URL} and create a key with a higher monthly limit",
                )
        balance = self.balance
        if balance <= 0:
            return PaymentDenied(
                "openrouter_credits",
                f"Insufficient credits. Add more using {TOP_UP_URL}",
            )
        if worst > balance:
            return PaymentDenied(
                "openrouter_credits",
                "This request requires more credits, or fewer max_tokens. You requested up "
                f"to {max_out} tokens, but can only afford {affordable(balance)}. To increase, "
                f"visit {CREDITS_URL} and add more credits",
            )
        if worst > balance - self.holds:
            return PaymentDenied(
                "openrouter_in_flight_budget",
                "Your in-flight requests already hold most of your remaining credits. This "
                f"request needs up to ${from_units(worst)}; retry when some requests finish, "
                "or lower max_tokens",
                retry_after=1.0,
            )
        return None

    def hold(self, key: KeyState, amount: int) -> None:
        key.holds += amount
        self.holds += amount

    def release(self, key: KeyState, amount: int) -> None:
        key.holds -= amount
        self.holds -= amount

    def charge(self, key: KeyState, amount: int) -> None:
        key.usage += amount
        key.last_used = self.wall_clock()
        self.usage += amount
