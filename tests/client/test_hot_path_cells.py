"""The functions every request runs keep no cell variables.

A local that a lambda, a nested function or a generator expression refers to
becomes a *cell*: a GC-tracked object made on every call of the enclosing
function, even when the closure itself is never built (the retry lambda of a
request that never fails). With 2,000 requests in flight their cells live as long
as the requests, survive collections into the older generations and lengthen
every collection after (docs/performance.md, "Where a request's CPU goes": the
cyclic garbage collector). Closures that only
a failure needs are built with ``functools.partial`` or in a function of their
own; this test keeps it that way.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from provider_router._http import session as _http
from provider_router.catalog._billable import measure
from provider_router.client._billing import Billing, Charged
from provider_router.client._completion import parse_completion
from provider_router.client._live_plan import LivePlan
from provider_router.client._request import RequestEncoder
from provider_router.client.health import ProviderHealth
from provider_router.client.limiter import AdaptiveLimiter
from provider_router.client.results import Usage, chat_result
from provider_router.client.router import Router
from provider_router.ledger.memory import MemoryLedger
from provider_router.routing.route_plan import RoutePlan

HOT_PATH: list[Callable[..., Any]] = [
    Router.chat,
    Router._build_request,
    LivePlan.current,
    Router._attempt,
    Router._exchange,
    Router._finish,
    Billing.charge,
    Billing.attach,
    Charged.result,
    RoutePlan.worst_case,
    RoutePlan.estimate,
    RequestEncoder.provider_bytes,
    RequestEncoder.encode,
    measure,
    MemoryLedger.reserve,
    MemoryLedger.settle,
    AdaptiveLimiter.try_acquire,
    AdaptiveLimiter.release,
    ProviderHealth.record_success,
    _http.HttpClient.send,
    _http._send,
    _http.PostResponse.json,
    parse_completion,
    Usage.from_json,
    chat_result,
]


def _code(fn: Callable[..., Any]) -> types.CodeType:
    fn = getattr(fn, "__func__", fn)  # classmethods
    code = getattr(fn, "__code__", None)
    assert isinstance(code, types.CodeType), f"{fn!r} is not a Python function"
    return code


@pytest.mark.parametrize("fn", HOT_PATH, ids=lambda fn: getattr(fn, "__qualname__", repr(fn)))
def test_a_per_request_function_keeps_no_cells(fn: Callable[..., Any]) -> None:
    assert _code(fn).co_cellvars == (), (
        f"{fn.__qualname__} makes {_code(fn).co_cellvars} cells on every call: build the "
        "closure with functools.partial or in a function of its own"
    )


def test_the_check_sees_a_cell() -> None:
    def with_closure(request: object) -> Callable[[], object]:
        return lambda: request

    assert _code(with_closure).co_cellvars == ("request",)
