"""Preparing one request: checked, encoded, priced and pinned once, before any attempt.

:class:`PrepareMixin` is the part of :class:`~provider_router.Router` that turns a
call's messages and fields into a
:class:`~provider_router.client._request.PreparedRequest`: the mistakes said
before anything is sent (no key, a bad ``max_tokens``, a field the reservation
cannot price, a prompt no allowed endpoint can hold), the body encoded once, the
deadline, what the endpoint it goes to must offer, and with cache affinity the
session's pinned endpoint. Which endpoint each attempt goes to (and so the body's
``provider`` object and the worst case reserved) is admission's choice, per attempt.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from provider_router._constants import ENV_API_KEY
from provider_router._exceptions import ConfigurationError, ContextLengthExceeded
from provider_router._types import Clock, Message
from provider_router.catalog._billable import (
    IMAGE_PROMPT_TOKENS_BOUND,
    check_fields,
    completion_cap,
    measure,
)
from provider_router.client._config import RESERVED_PARAMS
from provider_router.client._live_plan import NOT_OPEN
from provider_router.client._request import (
    PreparedRequest,
    messages_problem,
)
from provider_router.client._response_cache import with_sample_id
from provider_router.client.affinity import session_of

if TYPE_CHECKING:
    from pydantic import SecretStr

    from provider_router._http.session import HttpClient
    from provider_router.client._billing import Billing
    from provider_router.client._config import AffinityOptions, Timeouts
    from provider_router.client._live_plan import LivePlan
    from provider_router.client._request import RequestEncoder
    from provider_router.client.admission import Admission
    from provider_router.client.affinity import CacheAffinity
    from provider_router.client.health import ProviderHealth
    from provider_router.client.results import StreamDelta
    from provider_router.routing.route_plan import RoutePlan

__all__ = ["CONTEXT_BYTES_PER_TOKEN", "PrepareMixin"]

_FIT_NEEDS: Final = ("tools", "response_format")
"""Request fields the endpoint an attempt is admitted to must list: it is sent there
alone, and an endpoint without them answers in plain text (paid)."""
LOGPROBS_PARAMETER: Final = "logprobs"
"""Also a fit need, of a request asking for logprobs (``logprobs: true``, per call or
in the router's params): an endpoint without them answers with ``logprobs: null``."""
_ZERO: Final = Decimal(0)
_UNSET: Final[Any] = object()
_CAP_CACHE_SIZE: Final = 256

CONTEXT_BYTES_PER_TOKEN: Final = 32
"""Bytes of prompt text no token exceeds, for the check before sending: a request is
refused only when even that few prompt tokens plus its completion cap exceed every
allowed endpoint's context (an assumption on tokenizers: BPE vocabularies' longest
tokens are well under 32 bytes for text; the check errs toward sending)."""


def _check_fits(context: int, prompt_upper_bound: int, cap: int | None) -> None:
    """Refuse a request that cannot fit any allowed endpoint's context: it would be a 400.

    ``prompt_upper_bound`` counts UTF-8 bytes (plus template): divided by
    :data:`CONTEXT_BYTES_PER_TOKEN` it is a lower bound on the prompt's tokens. The
    prompt is what is judged (:class:`ContextLengthExceeded`: a batch counts the prompt
    and goes on); a completion cap alone beyond the context is left to the reservation
    and to OpenRouter's 400 (neither is paid).
    """
    least = prompt_upper_bound // CONTEXT_BYTES_PER_TOKEN
    completion = cap or 0
    if completion < context and least + completion > context:
        raise ContextLengthExceeded(
            context,
            least + completion,
            f"the request cannot fit: at least {least:,} prompt tokens plus max_tokens "
            f"{completion:,} exceed the largest context length of the allowed endpoints "
            f"({context:,} tokens); nothing was sent",
        )


def _check_logprobs(plan: RoutePlan) -> None:
    """Refuse a logprobs request no allowed endpoint could answer with logprobs.

    OpenRouter ignores ``logprobs`` where an endpoint does not list it (``logprobs:
    null``, not an error), so the router sends such a request with ``require_parameters:
    true``; with no allowed endpoint listing it, that would be a 404.
    """
    if not any(LOGPROBS_PARAMETER in r.endpoint.supported_parameters for r in plan.ranked):
        raise ConfigurationError(
            f"logprobs asked for, but no allowed endpoint of {plan.model!r} lists logprobs: "
            "OpenRouter would answer without them (or 404 with require_parameters); "
            "allow an endpoint that lists them, or drop logprobs; nothing was sent"
        )


class PrepareMixin:
    """Builds the prepared request every attempt sends (mixed into the Router)."""

    # The Router's state preparing reads (set by Router.__init__ and open()).
    cache_affinity: AffinityOptions | None
    response_cache: int | None
    affinity: CacheAffinity
    health: ProviderHealth
    timeouts: Timeouts
    _http: HttpClient | None
    _api_key: SecretStr | None
    _billing: Billing
    _plans: LivePlan
    _encoder: RequestEncoder
    _fields: dict[str, Any]
    _field_tokens: int
    _caps: dict[int | None, int | None]
    _clock: Clock
    _seq: itertools.count[int]
    _admission: Admission | None
    _default_logprobs: bool

    def _build_request(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        stream: bool,
        key: str | None,
        on_delta: Callable[[StreamDelta], Any] | None,
        params: Mapping[str, Any],
    ) -> PreparedRequest:
        """Check, encode and price one request (and pin its session) before any attempt."""
        if self._http is None or self._api_key is None:
            if self._http is None:
                raise ConfigurationError(NOT_OPEN)
            # Said before sending: OpenRouter's 401 would not name the variable.
            raise ConfigurationError(
                f"no API key: set {ENV_API_KEY} to your OpenRouter key or pass "
                "Router(api_key=...) (create one at https://openrouter.ai/keys); nothing was sent"
            )
        if (
            max_tokens is not None
            and not (type(max_tokens) is int and max_tokens >= 1)
            and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1)
        ):
            raise ConfigurationError(f"max_tokens must be a positive int, got {max_tokens!r}")
        extra_tokens = self._field_tokens
        if self.response_cache is not None:
            # Two samples of one prompt must not share a cached answer: each body
            # carries its label's sample id (an unlabelled call gets a label of its own).
            if key is None:
                key = f"req-{next(self._seq)}"
            params = with_sample_id(params, key, self._fields)
        if params:
            for reserved_name in RESERVED_PARAMS:
                if reserved_name in params:
                    raise ConfigurationError(
                        f"{reserved_name!r} is set by the Router, not per call"
                        + (
                            " (its open fields, such as enforce_distillable_text, go in "
                            "Router(params={'provider': {...}}))"
                            if reserved_name == "provider"
                            else ""
                        )
                    )
            check_fields(params)
            # The larger cap: a provider may honour either (docs/client.md, "What is reserved").
            cap = completion_cap(max_tokens, {**self._fields, **params})
        else:
            # The router's own fields never change: one cap per max_tokens.
            cap = self._caps.get(max_tokens, _UNSET)
            if cap is _UNSET:
                cap = completion_cap(max_tokens, self._fields)
                if len(self._caps) < _CAP_CACHE_SIZE:
                    self._caps[max_tokens] = cap
        if cap is None and self._billing.ledger is not None:
            raise ConfigurationError(
                "max_tokens is required when a ledger is used (max_completion_tokens also counts)"
            )
        plan = self._plans.current()
        admission = self._admission
        if admission is None:
            raise ConfigurationError(NOT_OPEN)
        if plan is not admission.plan:
            admission.update(plan)  # a refreshed plan: lanes keep what they learned
        encoder = self._encoder
        strict = self._default_logprobs
        if params and LOGPROBS_PARAMETER in params:
            strict = params[LOGPROBS_PARAMETER] is True
        if strict:
            _check_logprobs(plan)
        session = pinned = None
        if self.cache_affinity is not None:  # opt-in: a session waits for its own endpoint
            try:
                session = session_of(messages, params, self.affinity.digest_key)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
            if session is not None and "session_id" not in params:
                params = {**params, "session_id": session}
        # What the endpoint must list: an attempt goes to one endpoint, with no fallback
        # inside OpenRouter, and one without them answers in plain text (paid).
        needs = tuple(filter(params.__contains__, _FIT_NEEDS)) if params else ()
        if strict:  # logprobs only from endpoints that list them (docs/client.md)
            needs = (*needs, LOGPROBS_PARAMETER)
        try:
            head = encoder.encode_head(messages, max_tokens, stream, params)
            if params:
                # The fields' JSON, already encoded for the body, bounds what tools and
                # schemas add to the prompt: no second encoding (docs/performance.md).
                extra_tokens = encoder.last_fields_bytes
            text_tokens, images = measure(messages)
        except (AttributeError, TypeError, KeyError) as exc:
            # Checked only once it failed: the per-request path pays nothing for it.
            problem = messages_problem(messages)
            if problem is None:
                raise
            raise ConfigurationError(problem) from exc
        prompt_tokens = text_tokens + extra_tokens
        if plan.max_context_length is not None:
            _check_fits(plan.max_context_length, prompt_tokens, cap)
        min_context = prompt_tokens + (cap or 0)
        if session is not None:
            pinned = self.affinity.pin(
                session,
                plan,
                self._clock(),
                demoted=self.health.demoted(),
                needs=needs,
                min_context=min_context,
                prefer=functools.partial(admission.open_lanes, plan.order),
            )
        # The stream deadline scales with the completion cap the provider may honour.
        timeouts = self.timeouts
        deadline = timeouts.stream_deadline_for(cap) if stream else timeouts.request
        # Positional (in PreparedRequest's field order): a keyword call costs more. The
        # payload and worst case are the admitted endpoint's (_attempt._route).
        request = PreparedRequest(
            b"",
            stream,
            key if key is not None else f"req-{next(self._seq)}",
            _ZERO,
            prompt_tokens + images * IMAGE_PROMPT_TOKENS_BOUND,
            plan,
            on_delta,
            None,  # generation_id
            0,  # attempts
            deadline,
        )
        request.head = head
        request.prompt_tokens = prompt_tokens
        request.images = images
        request.cap = cap or 0
        request.pin_needs = (needs, min_context)
        request.strict = strict
        if session is not None:
            request.session = session
            request.pinned = pinned
        return request
