"""One dataset inside a run: where its prompts stand, and what may still be sent.

:class:`DatasetRun` is the runner's per-dataset state (its reader, tallies, what is
in flight) with the decisions that read only that state: may another prompt go out
(caps and the output-token target, in-flight work priced by
:class:`~provider_router.batch.targets.InFlightPricer`), is the dataset done, how many
prompts it will complete at most, and did its prompts run out short of the target.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from provider_router.batch.journal import DatasetTally
from provider_router.batch.summary import Counter
from provider_router.batch.targets import InFlightPricer
from provider_router.plan import DatasetSpec, reached
from provider_router.prompts import Prompt, PromptReader

__all__ = ["DatasetRun"]


@dataclass(slots=True)
class DatasetRun:
    """One dataset's state during a run (see the module docstring)."""

    spec: DatasetSpec
    params: dict[str, Any]
    max_tokens: int
    reader: PromptReader
    prompts: Iterator[Prompt]
    tally: DatasetTally
    counter: Counter
    relocate: bool
    pricer: InFlightPricer
    lines: int | None = None
    inflight: int = 0
    exhausted: bool = False

    def can_send(self) -> bool:
        """Another prompt may go out: no cap reached, and the target not yet covered."""
        if self.exhausted:
            return False
        spec = self.spec
        tally = self.tally
        if spec.max_requests is not None and tally.completed + self.inflight >= spec.max_requests:
            return False
        target = spec.target_output_tokens
        # What is in flight is priced high (the cap until lengths are known): an
        # under-estimate here is overshoot nothing can take back (see targets.py).
        return target is None or tally.output_tokens + self.pricer.price(self.inflight) < target

    def short_of_target(self) -> bool:
        """Every prompt was done and the output-token target is still not reached."""
        target = self.spec.target_output_tokens
        if target is None or self.tally.output_tokens >= target or not self.exhausted:
            return False
        cap = self.spec.max_requests
        return cap is None or self.tally.completed < cap

    def total(self) -> int | None:
        """Prompts it will complete at most, if known."""
        total: int | None
        if self.exhausted:
            total = self.tally.completed + self.inflight + self.counter.failures
        elif self.lines is not None:
            total = self.lines - self.reader.bad_lines
        else:
            total = None
        if total is not None and self.spec.max_requests is not None:
            total = min(total, self.spec.max_requests)
        return total

    def done(self) -> bool:
        """Nothing is left to do for it."""
        if reached(self.spec, self.tally.completed, self.tally.output_tokens):
            return True
        return self.exhausted and not self.counter.failures and self.inflight == 0
