"""What a job asks of OpenRouter besides its route, and what it keeps of the answer's trace.

A job generates data to train on, so every request asks OpenRouter for its routing
trace (``X-OpenRouter-Metadata: enabled``: each row keeps its attempts and pipeline),
turns context compression off explicitly (on endpoints of 8,192 tokens or less it is
on by default and drops the middle of a prompt), and by default routes only to models
whose author allows training on their outputs (``enforce_distillable_text``). A row
whose trace shows compression anyway is flagged (``context_compressed``) and counted;
``summary.json`` records what the run asked (docs/batch.md, docs/output.md).
"""

from __future__ import annotations

from typing import Any, Final

from provider_router._types import JSONObject
from provider_router.client.results import ChatResult
from provider_router.client.router_metadata import METADATA_HEADERS
from provider_router.planning.plan import Plan

__all__ = ["COMPRESSION_OFF", "openrouter_summary", "router_options", "trace_fields"]

COMPRESSION_OFF: Final[JSONObject] = {"id": "context-compression", "enabled": False}
"""The plugin entry that turns OpenRouter's context compression off for a request."""


def router_options(plan: Plan) -> dict[str, Any]:
    """The ``Router`` keyword arguments that ask what the plan asks of OpenRouter."""
    params: dict[str, Any] = {}
    if not plan.context_compression:
        params["plugins"] = [dict(COMPRESSION_OFF)]
    if plan.distillable_text:
        params["provider"] = {"enforce_distillable_text": True}
    return {"headers": dict(METADATA_HEADERS), "params": params}


def openrouter_summary(plan: Plan) -> JSONObject:
    """What the run asked of OpenRouter, for ``summary.json``."""
    return {
        "router_metadata": True,
        "context_compression": "allowed" if plan.context_compression else "off",
        "enforce_distillable_text": plan.distillable_text,
    }


def trace_fields(result: ChatResult) -> JSONObject:
    """The output record's fields from the answer's trace: ``router_metadata`` (its
    attempt, attempts and pipeline) and ``context_compressed: true`` when compressed;
    nothing when the answer carried no trace."""
    trace = result.router_metadata
    if trace is None:
        return {}
    fields: JSONObject = {"router_metadata": trace.to_json()}
    if trace.compressed:
        fields["context_compressed"] = True
    return fields
