"""A model vendor's own rules for the endpoints serving its model, as its verifier checks them.

Moonshot AI fixes Kimi's sampling parameters (temperature 1.0 and top_p 0.95 in
thinking mode; "cannot be modified" in its parameter table) and its Kimi Vendor
Verifier fails a vendor that accepts other values (``tests/params``: temperature 1.1,
thinking and non-thinking, must not succeed) or whose ``usage.prompt_tokens`` differs
from the reference count for the same request (``tests/prompt_tokens``: a changed chat
template, or an inflated bill). :func:`~provider_router.checks.verify.verify` applies
the rules of the model it measures (docs/policy.md, "Vendor rules").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["KIMI_RULES", "ParameterProbe", "VendorRules", "rules_for"]


@dataclass(frozen=True, slots=True)
class ParameterProbe:
    """A request a faithful endpoint must refuse.

    Attributes:
        label: what it asks, in words (``temperature 1.1 in thinking mode``).
        fields: the request fields that ask it.
    """

    label: str
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class VendorRules:
    """The rules one vendor holds the endpoints of its models to.

    Attributes:
        name: whose rules, as a report names them.
        models: the model ids they apply to (prefixes: a dated slug matches too).
        probes: requests every endpoint must refuse (each a 400 or 422).
        equal_prompt_tokens: ``usage.prompt_tokens`` must equal the reference's for
            the same request (within ``VerifyThresholds.max_prompt_token_difference``).
    """

    name: str
    models: tuple[str, ...]
    probes: tuple[ParameterProbe, ...] = ()
    equal_prompt_tokens: bool = False

    def applies_to(self, model: str) -> bool:
        """Whether ``model`` (an id, a dated slug, or either with a ``:variant``) is one."""
        base = model.split(":", 1)[0].lower()
        return any(base == m or base.startswith(m + "-") for m in self.models)


KIMI_RULES: Final = VendorRules(
    name="Moonshot AI's Kimi Vendor Verifier",
    models=("moonshotai/kimi-k2.5", "moonshotai/kimi-k2.6", "moonshotai/kimi-k3"),
    probes=(
        ParameterProbe("temperature 1.1 in thinking mode", {"temperature": 1.1}),
        ParameterProbe(
            "temperature 1.1 in non-thinking mode",
            {"temperature": 1.1, "reasoning": {"enabled": False}},
        ),
    ),
    equal_prompt_tokens=True,
)
"""Kimi K2.5, K2.6 and K3: fixed sampling parameters, prompt tokens counted as Moonshot
counts them (sources in docs/policy.md, "Vendor rules")."""

_RULES: Final = (KIMI_RULES,)


def rules_for(model: str) -> VendorRules | None:
    """The vendor rules that apply to ``model``, or None."""
    return next((rules for rules in _RULES if rules.applies_to(model)), None)
