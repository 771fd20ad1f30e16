"""Exact endpoint prices: the ``pricing`` record and the one cost formula.

:meth:`Pricing.cost` is how OpenRouter bills (notes §5); ranking, the client's
settlement and projections all call it, so they cannot disagree. The wire rules
(missing fees are 0, missing cache prices are ``None``, ``"-1"`` is dynamic) are
described in :mod:`provider_router.catalog.records`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, model_validator

from provider_router._constants import PER_MILLION
from provider_router._money import to_decimal

__all__ = ["DYNAMIC_PRICE_SENTINEL", "RECORD_CONFIG", "Pricing", "PricingOverride"]

RECORD_CONFIG: Final = ConfigDict(frozen=True, extra="allow")
"""What every metadata record is: tolerant going in, frozen.

A field we do not model is kept as sent (``record.model_extra``), never an error:
OpenRouter adds fields often (docs/records.md), and a newer one must not break a run.

Defined here, the lowest layer of the records; :mod:`provider_router.catalog.records` uses it too.
"""

DYNAMIC_PRICE_SENTINEL: Final = Decimal(-1)


def _price(value: object, field: str) -> Decimal | None:
    """A wire price → Decimal; ``"-1"`` → ``None`` (dynamic); negative or junk → error."""
    if value is None:
        return None
    try:
        price = to_decimal(value, what=f"price {field!r}")
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if price == DYNAMIC_PRICE_SENTINEL:
        return None
    if price < 0:
        raise ValueError(
            f"price {field!r} must be ≥ 0 USD per unit (or the '-1' dynamic sentinel), "
            f"got {value!r}"
        )
    return price


_REQUIRED_PRICES: Final = ("prompt", "completion")
# Fees OpenRouter omits when zero (2026) or lists as "0" (2025): missing means 0.
_ZERO_WHEN_MISSING: Final = (
    "request",
    "image",
    "image_token",
    "image_output",
    "audio",
    "audio_output",
    "input_audio_cache",
    "web_search",
    "internal_reasoning",
)
# Cache prices: missing means "not priced"; such tokens bill at the prompt rate.
_NONE_WHEN_MISSING: Final = ("input_cache_read", "input_cache_write", "input_cache_write_1h")
_PRICE_KEYS: Final = _REQUIRED_PRICES + _ZERO_WHEN_MISSING + _NONE_WHEN_MISSING


class PricingOverride(BaseModel):
    """A conditional price (long-context or time-of-day) from ``pricing.overrides``.

    Condition fields are numbers; a price key that is ``None`` inherits the base price.
    ``min_prompt_tokens`` applies when the prompt is strictly longer; ``utc_start``
    and ``utc_end`` are HHMM numbers of a half-open window that may wrap midnight.
    """

    model_config = RECORD_CONFIG

    min_prompt_tokens: Decimal | None = None
    utc_start: Decimal | None = None
    utc_end: Decimal | None = None
    utc_days: tuple[str, ...] | None = None
    """Weekdays (``monday`` ... ``sunday``) the entry is limited to; None: every day."""
    prompt: Decimal | None = None
    completion: Decimal | None = None
    input_cache_read: Decimal | None = None
    input_cache_write: Decimal | None = None
    input_cache_write_1h: Decimal | None = None
    audio: Decimal | None = None
    input_audio_cache: Decimal | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse_numbers(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for key in ("min_prompt_tokens", "utc_start", "utc_end"):
            if out.get(key) is not None:
                out[key] = to_decimal(out[key], what=f"override condition {key!r}")
        days = out.get("utc_days")
        if isinstance(days, list | tuple):
            out["utc_days"] = tuple(str(day).strip().lower() for day in days)
        for key in (
            "prompt",
            "completion",
            "input_cache_read",
            "input_cache_write",
            "input_cache_write_1h",
            "audio",
            "input_audio_cache",
        ):
            if key in out:
                out[key] = _price(out[key], key)
        return out

    def applies(
        self, prompt_tokens: int | Decimal, utc_hhmm: int | None, utc_weekday: str | None = None
    ) -> bool:
        """Whether this entry applies to a request of ``prompt_tokens`` at ``utc_hhmm``.

        A time-window entry never applies when ``utc_hhmm`` is ``None``, nor a
        weekday-limited one (``utc_days``) when ``utc_weekday`` is ``None``: the
        top-level prices already reflect the window in force when the listing was read.
        """
        if self.min_prompt_tokens is not None and not prompt_tokens > self.min_prompt_tokens:
            return False
        if self.utc_days is not None and (
            utc_weekday is None or utc_weekday.strip().lower() not in self.utc_days
        ):
            return False
        if self.utc_start is None and self.utc_end is None:
            return self.min_prompt_tokens is not None
        if utc_hhmm is None:
            return False
        start = self.utc_start if self.utc_start is not None else Decimal(0)
        end = self.utc_end if self.utc_end is not None else Decimal(2400)
        if start <= end:
            return start <= utc_hhmm < end
        return utc_hhmm >= start or utc_hhmm < end


class Pricing(BaseModel):
    """Exact prices in USD per unit (per token unless the name says otherwise).

    ``prompt`` and ``completion`` are ``None`` only for the ``"-1"`` dynamic-price
    sentinel (:attr:`is_dynamic`). Cache prices are ``None`` when the endpoint
    does not price caching. ``discount`` is a fraction already applied to the
    listed prices (negative means a markup).
    """

    model_config = RECORD_CONFIG

    prompt: Decimal | None
    completion: Decimal | None
    request: Decimal | None = Decimal(0)
    image: Decimal | None = Decimal(0)
    image_token: Decimal | None = Decimal(0)
    image_output: Decimal | None = Decimal(0)
    audio: Decimal | None = Decimal(0)
    audio_output: Decimal | None = Decimal(0)
    input_audio_cache: Decimal | None = Decimal(0)
    web_search: Decimal | None = Decimal(0)
    internal_reasoning: Decimal | None = Decimal(0)
    input_cache_read: Decimal | None = None
    input_cache_write: Decimal | None = None
    input_cache_write_1h: Decimal | None = None
    discount: Decimal = Decimal(0)
    overrides: tuple[PricingOverride, ...] = ()
    is_dynamic: bool = False
    """True when any price carried the ``"-1"`` sentinel (dynamic routers)."""

    @model_validator(mode="before")
    @classmethod
    def _parse_prices(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        dynamic = False
        for key in _PRICE_KEYS:
            if key not in out:
                continue
            raw = out[key]
            if raw is None and key in _ZERO_WHEN_MISSING:
                out[key] = Decimal(0)
                continue
            out[key] = _price(raw, key)
            dynamic = dynamic or (raw is not None and out[key] is None)
        for key in _REQUIRED_PRICES:
            if out.get(key, ...) is None and not dynamic:
                raise ValueError(f"price {key!r} must be a decimal string, got null")
        if out.get("discount") is None:
            out["discount"] = Decimal(0)
        else:
            out["discount"] = to_decimal(out["discount"], what="discount")
            if out["discount"] > 1:
                raise ValueError(f"discount must be ≤ 1 (1 = free), got {data['discount']!r}")
        if out.get("overrides") is None:
            out["overrides"] = ()
        out["is_dynamic"] = dynamic
        return out

    # --- per million -------------------------------------------------------------

    @property
    def prompt_per_million(self) -> Decimal | None:
        """USD per million prompt tokens (``None`` when dynamic)."""
        return None if self.prompt is None else self.prompt * PER_MILLION

    @property
    def completion_per_million(self) -> Decimal | None:
        """USD per million completion tokens (``None`` when dynamic)."""
        return None if self.completion is None else self.completion * PER_MILLION

    @property
    def cache_read_per_million(self) -> Decimal | None:
        """USD per million cached prompt tokens read (``None`` when not priced)."""
        return None if self.input_cache_read is None else self.input_cache_read * PER_MILLION

    # --- discount ----------------------------------------------------------------

    def list_price(self, price: Decimal | None) -> Decimal | None:
        """The undiscounted list price of a listed (net) price: ``price / (1 - discount)``.

        ``None`` when the price is unknown or the discount is 100 % (free: the list
        price cannot be recovered).
        """
        if price is None or self.discount == 1:
            return None
        return price / (1 - self.discount)

    # --- cost --------------------------------------------------------------------

    def effective(
        self, prompt_tokens: int | Decimal = 0, *, utc_hhmm: int | None = None
    ) -> Pricing:
        """These prices with the applicable ``overrides`` folded in (later entries win)."""
        changes: dict[str, Decimal] = {}
        for override in self.overrides:
            if override.applies(prompt_tokens, utc_hhmm):
                for key in ("prompt", "completion", "input_cache_read", "input_cache_write"):
                    value = getattr(override, key)
                    if value is not None:
                        changes[key] = value
        return self.model_copy(update=changes) if changes else self

    def cost(
        self,
        prompt_tokens: int | Decimal,
        completion_tokens: int | Decimal,
        *,
        cached_tokens: int | Decimal = 0,
        cache_write_tokens: int | Decimal = 0,
        requests: int | Decimal = 1,
        utc_hhmm: int | None = None,
    ) -> Decimal:
        """Exact USD for these token counts, as OpenRouter bills them (notes §5).

        ``prompt_tokens`` includes cached and cache-write tokens (as ``usage``
        reports them); ``completion_tokens`` includes reasoning tokens, which bill
        at the completion rate. Cached tokens bill at ``input_cache_read`` and
        written tokens at ``input_cache_write``, each falling back to ``prompt``
        when the endpoint does not price caching. ``requests`` multiplies the
        per-request fee. Overrides keyed on prompt length apply automatically;
        time-window overrides only when ``utc_hhmm`` is given. Token counts may be
        fractional Decimals (expected values).

        Raises:
            ValueError: negative counts, cached + written tokens above the prompt,
                or dynamic (``"-1"``) pricing, which has no cost to compute.
        """
        if (
            prompt_tokens < 0
            or completion_tokens < 0
            or cached_tokens < 0
            or cache_write_tokens < 0
            or requests < 0
        ):
            # Checked inline first: this runs once per answered request.
            for name, count in (
                ("prompt_tokens", prompt_tokens),
                ("completion_tokens", completion_tokens),
                ("cached_tokens", cached_tokens),
                ("cache_write_tokens", cache_write_tokens),
                ("requests", requests),
            ):
                if count < 0:
                    raise ValueError(f"{name} must be ≥ 0, got {count}")
        if cached_tokens + cache_write_tokens > prompt_tokens:
            raise ValueError(
                f"cached_tokens ({cached_tokens}) + cache_write_tokens ({cache_write_tokens}) "
                f"exceed prompt_tokens ({prompt_tokens})"
            )
        pricing = self.effective(prompt_tokens, utc_hhmm=utc_hhmm) if self.overrides else self
        prompt, completion = pricing.prompt, pricing.completion
        if prompt is None or completion is None:
            raise ValueError("dynamic pricing ('-1' sentinel) has no per-token cost to compute")
        read = prompt if pricing.input_cache_read is None else pricing.input_cache_read
        write = prompt if pricing.input_cache_write is None else pricing.input_cache_write
        uncached = prompt_tokens - cached_tokens - cache_write_tokens
        return (
            uncached * prompt
            + cached_tokens * read
            + cache_write_tokens * write
            + completion_tokens * completion
            + requests * (pricing.request or 0)
        )
