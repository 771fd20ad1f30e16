"""Live Prometheus metrics of a Router (and so of a batch run), with ``prometheus_client``.

::

    metrics = Metrics()                      # its own CollectorRegistry
    metrics.serve(9464)                      # http://127.0.0.1:9464/metrics
    async with Router(model, ledger=ledger, metrics=metrics) as router:
        ...

``provider-router run --metrics-port 9464`` does the same for a batch run. Needs the
``metrics`` extra; without it, :class:`Metrics` raises
:class:`~provider_router.MissingDependencyError`. What is exported (prefix
``provider_router_``) is listed in docs/observability.md. Money in Prometheus is a
float, for dashboards: the exact figures are the ledger's and ``summary.json``'s. With
``metrics=None`` (the default) the Router does no metrics work: one ``is None`` test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Protocol

from provider_router._exceptions import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from provider_router.ledger import LedgerState

__all__ = ["DEFAULT_METRICS_INTERVAL", "LATENCY_BUCKETS", "Metrics"]

DEFAULT_METRICS_INTERVAL: Final = 1.0
"""Seconds between two samples of the ledger's totals."""
LATENCY_BUCKETS: Final = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
    600.0,
)
"""Seconds: LLM requests run from a fraction of a second to minutes."""
_NO_PROVIDER: Final = "none"


class BatchFigures(Protocol):
    """One dataset of the batch route (``batch_view.DatasetBatches``; read here by shape,
    as nothing below the runner imports it)."""

    @property
    def name(self) -> str: ...
    @property
    def states(self) -> Mapping[str, int]: ...
    @property
    def submitted(self) -> int: ...
    @property
    def lines_done(self) -> int: ...
    @property
    def lines_failed(self) -> int: ...
    @property
    def lines_in_batches(self) -> int: ...
    @property
    def held(self) -> Decimal: ...
    @property
    def booked(self) -> Decimal: ...
    @property
    def providers(self) -> Mapping[str, int]: ...
    def window_left(self, now: float) -> float | None: ...


class BatchViewed(Protocol):
    """The batch route's view (``batch_view.BatchView``)."""

    @property
    def datasets(self) -> Sequence[BatchFigures]: ...


class LaneRead(Protocol):
    """One lane's figures (``client.admission.LaneStats``, read by shape)."""

    @property
    def in_flight(self) -> int: ...
    @property
    def capacity(self) -> int | None: ...


class AdmissionRead(Protocol):
    """What the metrics read of admission (``client.admission.Admission``)."""

    def snapshot(self) -> Mapping[str, LaneRead]: ...
    def waiting_by_lane(self) -> Mapping[str, int]: ...


class _AdmissionCollector:
    """Admission's per-endpoint gauges, read at scrape time (a custom collector: the
    endpoints are known only once the router is open)."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}_" if namespace else ""
        self.admission: AdmissionRead | None = None

    def describe(self) -> list[Any]:
        return []  # read at scrape time only: nothing to check at registration

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        admission = self.admission
        if admission is None:
            return
        lanes = admission.snapshot()
        waiting = admission.waiting_by_lane()
        families = (
            ("admission_waiting", "Requests waiting for an endpoint, by the one they wait for"),
            ("admission_in_flight", "Attempts in flight at each endpoint"),
            ("admission_capacity", "Requests in flight each endpoint takes, as learned"),
        )
        made = [GaugeMetricFamily(self.prefix + n, h, labels=["endpoint"]) for n, h in families]
        for tag, lane in lanes.items():
            made[0].add_metric([tag], waiting.get(tag, 0))
            made[1].add_metric([tag], lane.in_flight)
            capacity = lane.capacity
            made[2].add_metric([tag], float("nan") if capacity is None else capacity)
        yield from made


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingDependencyError("Prometheus metrics (--metrics-port)", "metrics") from exc
    return prometheus_client


class Metrics:
    """The Prometheus metrics of one Router (docs/observability.md lists them).

    Args:
        registry: a ``prometheus_client.CollectorRegistry`` to register in (default:
            a new one of its own, so two routers in one process never collide).
        namespace: the metric name prefix.
        interval: seconds between two samples of the ledger's totals.

    Raises:
        MissingDependencyError: ``prometheus_client`` is not installed.
    """

    def __init__(
        self,
        registry: Any = None,
        *,
        namespace: str = "provider_router",
        interval: float = DEFAULT_METRICS_INTERVAL,
    ) -> None:
        prom = _import_prometheus()
        if not interval > 0:
            raise ConfigurationError(f"metrics interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self._server: Any = None
        self._thread: Any = None
        kw = {"namespace": namespace, "registry": self.registry}
        self.requests = prom.Counter(
            "requests", "Finished requests by provider and outcome", ["provider", "outcome"], **kw
        )
        self.attempt_failures = prom.Counter(
            "attempt_failures", "Failed attempts by provider and kind", ["provider", "kind"], **kw
        )
        self.rate_limited = prom.Counter(
            "rate_limited", "429 rate-limit answers", ["provider"], **kw
        )
        self.retries = prom.Counter("retries", "Attempts beyond the first", **kw)
        self.prompt_tokens = prom.Counter(
            "prompt_tokens", "Prompt tokens of answered requests", ["provider"], **kw
        )
        self.output_tokens = prom.Counter(
            "output_tokens", "Output (completion) tokens of answered requests", ["provider"], **kw
        )
        self.cost = prom.Counter(
            "cost_usd", "USD charged for answers (usage.cost)", ["provider"], **kw
        )
        self.truncated = prom.Counter(
            "truncated",
            "Answers cut at max_tokens (finish_reason length): paid for, not whole",
            ["provider"],
            **kw,
        )
        self.truncated_cost = prom.Counter(
            "truncated_cost_usd", "USD charged for answers cut at max_tokens", ["provider"], **kw
        )
        self.latency = prom.Histogram(
            "request_latency_seconds",
            "Whole-request latency, retries included",
            ["provider"],
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.spent = prom.Gauge("spent_usd", "The ledger's settled spend", **kw)
        self.reserved = prom.Gauge("reserved_usd", "Held by open reservations", **kw)
        self.limit = prom.Gauge("budget_limit_usd", "The ledger's limit (the budget)", **kw)
        self.window = prom.Gauge("limiter_window", "The adaptive limiter's window", **kw)
        self.batches = prom.Gauge(
            "batches", "Batch API batches by dataset and state", ["dataset", "state"], **kw
        )
        self.batch_lines = prom.Gauge(
            "batch_lines", "Batch lines by dataset and outcome", ["dataset", "outcome"], **kw
        )
        self.batch_cost = prom.Gauge(
            "batch_cost_usd",
            "USD held for live batches, booked for ended ones",
            ["dataset", "kind"],
            **kw,
        )
        self.batch_providers = prom.Gauge(
            "batch_provider_batches", "Batches per serving provider", ["dataset", "provider"], **kw
        )
        self.batch_window = prom.Gauge(
            "batch_window_seconds",
            "Seconds until the oldest live batch's 24 h window ends",
            ["dataset"],
            **kw,
        )
        self.in_flight = prom.Gauge("in_flight", "Requests in flight (sent)", **kw)
        self.waiting_for_budget = prom.Gauge(
            "waiting_for_budget", "Requests waiting for room in the budget (not sent)", **kw
        )
        self.to_finish = prom.Gauge(
            "to_finish_usd", "A batch run's money still to spend to finish its plan", **kw
        )
        self.to_finish.set(float("nan"))
        self.verification_checks = prom.Gauge(
            "verification_checks", "run --verify's checks over the job", ["outcome"], **kw
        )
        self.verification_cost = prom.Gauge(
            "verification_cost_usd", "USD run --verify's checks cost", **kw
        )
        self.verification_excluded = prom.Gauge(
            "verification_excluded_endpoints",
            "Endpoints run --verify excluded (failed a check)",
            ["provider"],
            **kw,
        )
        self.verification_flagged = prom.Gauge(
            "verification_flagged_rows",
            "Rows served since the provider's last passing check, before it failed one",
            ["provider"],
            **kw,
        )
        self.floor_cost = prom.Counter(
            "floor_cost_usd",
            "USD the answers would have cost at the floor (the cheapest allowed endpoint)",
            ["provider"],
            **kw,
        )
        self.refusals = prom.Counter(
            "admission_refused",
            "Endpoint refusals (429) taken back to admission",
            ["endpoint", "provider"],
            **kw,
        )
        self.admission_wait = prom.Histogram(
            "admission_wait_seconds",
            "Seconds a request waited for an endpoint (only requests that waited)",
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self._waiting = 0
        self._namespace = namespace
        self._admission: Any = None

    def __repr__(self) -> str:
        where = "not served" if self._server is None else f"serving on {self.address}"
        return f"Metrics({where})"

    # --- what the Router calls ---------------------------------------------------------

    def watch(self, window: Callable[[], float], in_flight: Callable[[], int]) -> None:
        """Read the limiter's window and the requests in flight at each scrape."""
        self.window.set_function(window)
        # The Router counts a request from its reservation on; one waiting for room
        # in the budget is not in flight (the ledger's sampled count of those).
        self.in_flight.set_function(lambda: max(in_flight() - self._waiting, 0))

    def watch_admission(self, admission: AdmissionRead) -> None:
        """Read each endpoint's waiting requests, attempts in flight and learned capacity
        at each scrape (``admission_waiting``, ``admission_in_flight``,
        ``admission_capacity``, by ``endpoint``)."""
        if self._admission is None:
            self._admission = _AdmissionCollector(self._namespace)
            self.registry.register(self._admission)
        self._admission.admission = admission

    def refused(self, endpoint: str, provider: str) -> None:
        """An endpoint refused an attempt (its 429): the request went back to admission
        (a 429 answer, not a failed attempt)."""
        self.refusals.labels(endpoint, provider).inc()
        self.rate_limited.labels(provider).inc()

    def plan_to_finish(self, amount: Decimal | None) -> None:
        """Record a batch run's to-finish (None: not known yet)."""
        self.to_finish.set(float("nan") if amount is None else float(amount))

    def batch_view(self, view: BatchViewed, now: float) -> None:
        """Record the batch route's view (``jobs/observe/batch_view.py``) at ``now``."""
        for d in view.datasets:
            for state, n in d.states.items():
                self.batches.labels(d.name, state).set(n)
            self.batches.labels(d.name, "submitted").set(d.submitted)
            self.batch_lines.labels(d.name, "done").set(d.lines_done)
            self.batch_lines.labels(d.name, "failed").set(d.lines_failed)
            self.batch_lines.labels(d.name, "in_batches").set(d.lines_in_batches)
            self.batch_cost.labels(d.name, "held").set(float(d.held))
            self.batch_cost.labels(d.name, "booked").set(float(d.booked))
            for provider, n in d.providers.items():
                self.batch_providers.labels(d.name, provider).set(n)
            left = d.window_left(now)
            self.batch_window.labels(d.name).set(float("nan") if left is None else left)

    def verification(
        self,
        *,
        made: int,
        not_made: int,
        cost: Decimal,
        excluded: Mapping[str, int],
        flagged: Mapping[str, int],
    ) -> None:
        """Record ``run --verify``'s figures over the job: checks made and not made, their
        cost, endpoints excluded and rows flagged per provider."""
        self.verification_checks.labels("made").set(made)
        self.verification_checks.labels("not_made").set(not_made)
        self.verification_cost.set(float(cost))
        for provider, n in excluded.items():
            self.verification_excluded.labels(provider).set(n)
        for provider, n in flagged.items():
            self.verification_flagged.labels(provider).set(n)

    def ledger_state(self, state: LedgerState) -> None:
        """Record a sample of the ledger's totals."""
        self.spent.set(float(state.spent))
        self.reserved.set(float(state.reserved))
        self.limit.set(float(state.limit))
        self._waiting = state.waiting
        self.waiting_for_budget.set(state.waiting)

    def answered(
        self,
        provider: str | None,
        *,
        quarantined: bool,
        attempts: int,
        prompt_tokens: int,
        output_tokens: int,
        cost: Decimal | None,
        latency: float,
        finish_reason: str | None = None,
        floor_cost: Decimal | None = None,
        waited: float = 0.0,
    ) -> None:
        """A request finished with an answer (``finish_reason: length``: cut at
        ``max_tokens``, counted apart too)."""
        name = provider or _NO_PROVIDER
        if floor_cost is not None:
            self.floor_cost.labels(name).inc(float(floor_cost))
        if waited > 0:
            self.admission_wait.observe(waited)
        self.requests.labels(name, "quarantined" if quarantined else "success").inc()
        if attempts > 1:
            self.retries.inc(attempts - 1)
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.output_tokens.labels(name).inc(output_tokens)
        if cost is not None:
            self.cost.labels(name).inc(float(cost))
        if finish_reason == "length":
            self.truncated.labels(name).inc()
            if cost is not None:
                self.truncated_cost.labels(name).inc(float(cost))
        self.latency.labels(name).observe(latency)

    def failed(self, exc: BaseException, attempts: int) -> None:
        """A request raised (every attempt failed, or a non-retryable answer)."""
        provider = getattr(exc, "provider_name", None) or _NO_PROVIDER
        self.requests.labels(provider, type(exc).__name__).inc()
        if attempts > 1:
            self.retries.inc(attempts - 1)

    def attempt_failed(self, provider: str | None, kind: str, rate_limited: bool) -> None:
        """One attempt failed (it may be retried)."""
        name = provider or _NO_PROVIDER
        self.attempt_failures.labels(name, kind).inc()
        if rate_limited:
            self.rate_limited.labels(name).inc()

    # --- serving ---------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``addr:port`` (a background thread; port 0 picks one).

        Raises:
            ConfigurationError: the port cannot be bound (in use, not permitted).
        """
        if self._server is not None:
            raise ConfigurationError(f"metrics are already served on {self.address}")
        prom = _import_prometheus()
        try:
            self._server, self._thread = prom.start_http_server(
                port, addr=addr, registry=self.registry
            )
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}"
            ) from None

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)`` being served, or None."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            if self._thread is not None:
                self._thread.join(5)
                self._thread = None
