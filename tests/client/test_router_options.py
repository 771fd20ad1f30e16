"""The Router's grouped options (Timeouts, AffinityOptions, Safeguards), its signature,
and the previous release's keywords: each still works, warns at the caller, and may
not be mixed with the argument that replaces it."""

from __future__ import annotations

import dataclasses
import inspect
import random
import warnings
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MakeRouter

from provider_router import (
    AdaptiveLimiter,
    AffinityOptions,
    Catalog,
    ConfigurationError,
    RetryPolicy,
    Router,
    Safeguards,
    Timeouts,
)
from provider_router._constants import (
    DEFAULT_CATALOG_TTL,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_COST_SANITY_FACTOR,
    DEFAULT_CREDITS_HOLD_TIMEOUT,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_VIOLATIONS_IN_A_ROW,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STREAM_IDLE_TIMEOUT,
    STREAM_DEADLINE_BASE,
    STREAM_DEADLINE_TOKENS_PER_SECOND,
)
from provider_router.client._deprecated import DEPRECATED_KEYWORDS
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

KEY = DEFAULT_TEST_KEY
DEPRECATED = r"is deprecated and will be removed in the next release"


def test_the_router_takes_at_most_22_parameters() -> None:
    names = [n for n in inspect.signature(Router.__init__).parameters if n != "self"]
    assert len(names) <= 22, names


def test_the_defaults_are_the_named_constants() -> None:
    assert Timeouts() == Timeouts(
        request=DEFAULT_REQUEST_TIMEOUT,
        connect=DEFAULT_CONNECT_TIMEOUT,
        stream_idle=DEFAULT_STREAM_IDLE_TIMEOUT,
        stream_deadline=None,
    )
    assert Safeguards() == Safeguards(
        credits_hold_timeout=DEFAULT_CREDITS_HOLD_TIMEOUT,
        cost_sanity_factor=DEFAULT_COST_SANITY_FACTOR,
        max_violations_in_a_row=DEFAULT_MAX_VIOLATIONS_IN_A_ROW,
    )
    assert AffinityOptions() == AffinityOptions(pin_fallbacks=False, hit_rate=None)
    router = Router(KIMI, api_key=KEY)
    assert (router.timeouts, router.safeguards) == (Timeouts(), Safeguards())
    assert router.cache_affinity is None
    assert router.catalog_ttl == DEFAULT_CATALOG_TTL
    assert router.limiter.max_concurrency == DEFAULT_MAX_CONCURRENCY


def test_the_options_are_frozen_values() -> None:
    timeouts = Timeouts(request=30)
    with pytest.raises(dataclasses.FrozenInstanceError):
        timeouts.request = 60  # type: ignore[misc]
    assert dataclasses.replace(timeouts, connect=3) == Timeouts(request=30, connect=3)
    assert hash(Safeguards()) == hash(Safeguards())


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: Timeouts(request=0), r"Timeouts\.request must be > 0 seconds, got 0"),
        (lambda: Timeouts(connect=-1), r"Timeouts\.connect must be > 0 seconds, got -1"),
        (lambda: Timeouts(stream_idle="5"), r"Timeouts\.stream_idle must be > 0 seconds"),
        (lambda: Timeouts(stream_deadline=0), r"Timeouts\.stream_deadline must be > 0"),
        (lambda: Timeouts(request=True), r"Timeouts\.request must be > 0 seconds, got True"),
        (lambda: AffinityOptions(hit_rate="1.5"), r"hit_rate must be between 0 and 1"),
        (lambda: AffinityOptions(hit_rate="many"), r"AffinityOptions\.hit_rate must be a dec"),
        (lambda: AffinityOptions(pin_fallbacks="yes"), r"pin_fallbacks must be True or False"),
        (lambda: Safeguards(credits_hold_timeout=-1), r"credits_hold_timeout must be >= 0"),
        (lambda: Safeguards(cost_sanity_factor=Decimal("0.5")), r"cost_sanity_factor must be"),
        (lambda: Safeguards(cost_sanity_factor="x"), r"cost_sanity_factor must be a number"),
        (lambda: Safeguards(max_violations_in_a_row=0), r"max_violations_in_a_row must be an"),
    ],
)
def test_an_option_checks_itself_when_built(build: Callable[[], object], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        build()


def test_numbers_are_kept_as_decimals() -> None:
    assert AffinityOptions(hit_rate="0.9").hit_rate == Decimal("0.9")
    assert AffinityOptions(hit_rate=0.25).hit_rate == Decimal("0.25")
    assert Safeguards(cost_sanity_factor=5).cost_sanity_factor == Decimal(5)
    assert Safeguards(credits_hold_timeout=0).credits_hold_timeout == 0  # never waits


def test_the_stream_deadline_scales_with_the_cap_unless_fixed() -> None:
    scaled = STREAM_DEADLINE_BASE + 8192 / STREAM_DEADLINE_TOKENS_PER_SECOND
    assert Timeouts().stream_deadline_for(8192) == scaled
    assert Timeouts().stream_deadline_for(None) == STREAM_DEADLINE_BASE
    assert Timeouts(stream_deadline=30).stream_deadline_for(8192) == 30


def test_cache_affinity_takes_a_switch_or_the_options() -> None:
    assert Router(KIMI, api_key=KEY, cache_affinity=True).cache_affinity == AffinityOptions()
    assert Router(KIMI, api_key=KEY, cache_affinity=False).cache_affinity is None
    options = AffinityOptions(pin_fallbacks=True, hit_rate="0.8")
    assert Router(KIMI, api_key=KEY, cache_affinity=options).cache_affinity is options


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"timeouts": 30}, r"timeouts must be a Timeouts\(\.\.\.\), got int"),
        ({"safeguards": {"cost_sanity_factor": 3}}, r"safeguards must be a Safeguards"),
        ({"cache_affinity": "yes"}, r"cache_affinity must be True, False or an AffinityOptions"),
    ],
)
def test_an_option_of_the_wrong_kind_is_refused(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Router(KIMI, api_key=KEY, **given)


async def test_the_options_reach_the_connection_and_the_plan(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(
        openrouter_sim,
        timeouts=Timeouts(connect=3),
        cache_affinity=AffinityOptions(hit_rate="0.9"),
    )
    assert router._http is not None
    assert router._http._connect_timeout == 3
    assert router._plans.cache_workload.cached_prompt_share == Decimal("0.9")


# --- the previous release's keywords ---------------------------------------------

LIMITER = AdaptiveLimiter(7)
RNG = random.Random(7)
CATALOG = Catalog("http://127.0.0.1:9/api/v1", ttl=42)

# old keyword, its value, the arguments that replace it, what the router then holds
OLD_AND_NEW: list[tuple[str, Any, dict[str, Any], Callable[[Router], object]]] = [
    ("request_timeout", 5, {"timeouts": Timeouts(request=5)}, lambda r: r.timeouts),
    ("connect_timeout", 3, {"timeouts": Timeouts(connect=3)}, lambda r: r.timeouts),
    ("stream_idle_timeout", 9, {"timeouts": Timeouts(stream_idle=9)}, lambda r: r.timeouts),
    ("stream_deadline", 30, {"timeouts": Timeouts(stream_deadline=30)}, lambda r: r.timeouts),
    (
        "credits_hold_timeout",
        10,
        {"safeguards": Safeguards(credits_hold_timeout=10)},
        lambda r: (r.safeguards, r._billing._hold_timeout),
    ),
    (
        "cost_sanity_factor",
        7,
        {"safeguards": Safeguards(cost_sanity_factor=7)},
        lambda r: (r.safeguards, r._billing.sanity_factor),
    ),
    (
        "max_violations_in_a_row",
        5,
        {"safeguards": Safeguards(max_violations_in_a_row=5)},
        lambda r: r.safeguards,
    ),
    (
        "pin_fallbacks",
        True,
        {"cache_affinity": AffinityOptions(pin_fallbacks=True)},
        lambda r: (r.cache_affinity, r._pin_fallbacks),
    ),
    (
        "cache_hit_rate",
        "0.9",
        {"cache_affinity": AffinityOptions(hit_rate="0.9")},
        lambda r: (r.cache_affinity, r._plans.cache_workload),
    ),
    ("catalog", CATALOG, {"endpoints": CATALOG}, lambda r: (r._plans.catalog, r.catalog_ttl)),
    ("limiter", LIMITER, {"max_concurrency": LIMITER}, lambda r: r.limiter),
    ("rng", RNG, {"retry": RetryPolicy(rng=RNG)}, lambda r: (r.retry, r._rng)),
]


def test_every_old_keyword_is_covered() -> None:
    covered = {case[0] for case in OLD_AND_NEW} | {"catalog_ttl", "allow_fallbacks"}
    assert covered == DEPRECATED_KEYWORDS


def test_allow_fallbacks_is_deprecated_and_still_reaches_the_plan() -> None:
    """Requests go to one endpoint each (cost-first admission): the keyword only sets
    the route plan's whole routing object, which the Batch API route reads."""
    with pytest.warns(DeprecationWarning, match=r"no longer affects requests") as seen:
        router = Router(KIMI, api_key=KEY, allow_fallbacks=False)
    assert seen.list[0].filename == __file__, "the warning points at the caller"
    assert router.allow_fallbacks is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Router(KIMI, api_key=KEY).allow_fallbacks is True


@pytest.mark.parametrize(
    ("old", "value", "new", "holds"), OLD_AND_NEW, ids=[case[0] for case in OLD_AND_NEW]
)
def test_an_old_keyword_warns_at_the_caller_and_does_the_same(
    old: str, value: Any, new: dict[str, Any], holds: Callable[[Router], object]
) -> None:
    # pin_fallbacks and cache_hit_rate only ever applied with cache_affinity on.
    switch = {"cache_affinity": True} if old in ("pin_fallbacks", "cache_hit_rate") else {}
    with pytest.warns(DeprecationWarning, match=rf"Router\({old}=\.\.\.\) is deprecated") as seen:
        before = Router(KIMI, api_key=KEY, **switch, **{old: value})
    (warning,) = seen.list
    assert warning.filename == __file__, "the warning points at the caller"
    assert "will be removed in the next release: pass " in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        now = Router(KIMI, api_key=KEY, **new)
    assert holds(before) == holds(now)


def test_catalog_ttl_still_sets_the_plan_refresh() -> None:
    with pytest.warns(DeprecationWarning, match=r"pass endpoints=Catalog\(ttl=\.\.\.\)"):
        router = Router(KIMI, api_key=KEY, catalog_ttl=60)
    assert router.catalog_ttl == 60
    with (
        pytest.warns(DeprecationWarning, match=DEPRECATED),
        pytest.raises(ConfigurationError, match="catalog_ttl"),
    ):
        Router(KIMI, api_key=KEY, catalog_ttl=0)


def test_old_timeouts_together_make_one_object() -> None:
    with pytest.warns(DeprecationWarning, match=DEPRECATED) as seen:
        router = Router(KIMI, api_key=KEY, request_timeout=5, connect_timeout=2)
    assert len(seen.list) == 2
    assert router.timeouts == Timeouts(request=5, connect=2)


@pytest.mark.parametrize(
    ("old", "says"),
    [
        ({"request_timeout": 0}, "request_timeout must be > 0 seconds, got 0"),
        ({"stream_deadline": 0}, "stream_deadline must be > 0 seconds, got 0"),
        ({"cost_sanity_factor": True}, "cost_sanity_factor must be a number >= 1, got True"),
        ({"max_violations_in_a_row": 2.5}, "max_violations_in_a_row must be an int >= 1"),
        ({"cache_hit_rate": "1.5"}, "cache_hit_rate must be between 0 and 1"),
    ],
)
def test_a_bad_old_keyword_is_refused_under_its_old_name(old: dict[str, Any], says: str) -> None:
    with (
        pytest.warns(DeprecationWarning, match=DEPRECATED),
        pytest.raises(ConfigurationError) as raised,
    ):
        Router(KIMI, api_key=KEY, **old)
    assert str(raised.value).startswith(says)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"request_timeout": 5, "timeouts": Timeouts()}, "request_timeout= and timeouts="),
        ({"stream_deadline": 9, "timeouts": Timeouts()}, "stream_deadline= and timeouts="),
        ({"cost_sanity_factor": 3, "safeguards": Safeguards()}, "cost_sanity_factor= and"),
        (
            {"pin_fallbacks": True, "cache_affinity": AffinityOptions()},
            "pin_fallbacks= and cache_affinity=",
        ),
        ({"catalog": CATALOG, "endpoints": CATALOG}, "catalog= and endpoints="),
        ({"limiter": LIMITER, "max_concurrency": LIMITER}, "limiter= and max_concurrency="),
        ({"rng": RNG, "retry": RetryPolicy(rng=RNG)}, "rng= and retry="),
    ],
)
def test_an_old_keyword_with_its_replacement_is_refused(given: dict[str, Any], says: str) -> None:
    with (
        pytest.warns(DeprecationWarning, match=DEPRECATED),
        pytest.raises(ConfigurationError) as raised,
    ):
        Router(KIMI, api_key=KEY, **given)
    assert says in str(raised.value)
    assert "pass only" in str(raised.value)


def test_an_old_keyword_beside_unrelated_new_ones_is_folded_in() -> None:
    # A retry policy of one's own keeps its settings and gains the old rng.
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        router = Router(KIMI, api_key=KEY, retry=RetryPolicy(max_attempts=2), rng=RNG)
    assert router.retry.max_attempts == 2
    assert router.retry.rng is RNG
    # A limiter wins over a number, as before.
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        router = Router(KIMI, api_key=KEY, max_concurrency=10, limiter=LIMITER)
    assert router.limiter is LIMITER


def test_a_keyword_the_router_never_took_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'request_timout'"):
        Router(KIMI, api_key=KEY, request_timout=5)
