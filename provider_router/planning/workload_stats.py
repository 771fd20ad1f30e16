"""Workload statistics from data: prompt tokens from input files, response lengths from a pilot.

Prompt tokens are *estimated* from the prompt files without calling anyone: with no
tokenizer, the usual approximation for BPE chat models (about four characters a
token, plus the chat template's tokens: OpenAI's cookbook rule, worse on CJK text);
pass ``count_tokens`` (any ``str -> int``, e.g. a ``tiktoken`` encoding's) to count
exactly. Response lengths cannot be estimated from the prompts: a *pilot* sends a
sample of real prompts through the routed, budgeted :class:`~provider_router.Router`
(:func:`run_pilot`), measures ``usage``, and turns it into a
:class:`~provider_router.planning.workload.WorkloadEstimate` whose range is the
confidence interval of the mean.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import ConfigurationError, DataFileError, ProviderRouterError
from provider_router._log import get_logger
from provider_router._types import Message
from provider_router.catalog.verdicts import Estimate, share_estimate
from provider_router.client.results import Usage
from provider_router.client.router import Router
from provider_router.planning.prompts import Prompt, PromptReader
from provider_router.planning.workload import SampleStats, WorkloadEstimate, estimate_from_samples

__all__ = [
    "CHARS_PER_TOKEN",
    "PilotResult",
    "PrefixShare",
    "PromptFileStats",
    "approx_prompt_tokens",
    "measure_prompts",
    "pilot_result",
    "run_pilot",
    "sample_prompts",
    "shared_prefix_share",
]


log = get_logger(__name__)

CHARS_PER_TOKEN: Final = 4
"""Characters of text per token in the approximation (BPE tokenizers, English and code)."""
_MESSAGE_OVERHEAD: Final = 4
_REPLY_PRIMING: Final = 3

TokenCounter = Callable[[str], int]
"""Counts the tokens of a text (a real tokenizer)."""


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def approx_prompt_tokens(
    messages: Sequence[Message],
    *,
    count_tokens: TokenCounter | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> int:
    """Prompt tokens of ``messages``: the documented approximation, or exact text counts.

    Without ``count_tokens``: ``ceil(characters / 4)`` per message text. With it:
    its count. Either way each message adds 4 tokens of chat template and the
    request 3 to prime the reply. ``tools`` (the request's tool definitions, which
    the chat template renders into the prompt) add the tokens of their compact JSON.
    """
    total = _REPLY_PRIMING
    if tools:
        text = json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False)
        total += (
            count_tokens(text) if count_tokens is not None else -(-len(text) // CHARS_PER_TOKEN)
        )
    for message in messages:
        text = _text(message.get("content"))
        if count_tokens is not None:
            tokens = count_tokens(text)
        else:
            tokens = -(-len(text) // CHARS_PER_TOKEN)
        total += _MESSAGE_OVERHEAD + tokens
    return total


@dataclass(frozen=True, slots=True)
class PromptFileStats:
    """What the prompt files of a dataset hold.

    Attributes:
        prompts: usable prompts (bad lines excluded).
        problems: the bad lines, each naming file and line.
        tokens: statistics of the per-prompt token estimate (``None`` when fewer
            than two prompts).
        mean_tokens: mean prompt tokens per request (0 when there are none).
        method: ``"approximation"`` or ``"tokenizer"``.
    """

    prompts: int
    problems: tuple[DataFileError, ...]
    tokens: SampleStats | None
    mean_tokens: Decimal
    method: str


def measure_prompts(
    paths: Iterable[str | Path],
    *,
    count_tokens: TokenCounter | None = None,
    limit: int | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> PromptFileStats:
    """Stream prompt files (JSONL) and estimate the prompt tokens of each line.

    Args:
        paths: the dataset's prompt files.
        count_tokens: a real tokenizer's count (default: the approximation).
        tools: the tool definitions sent with every prompt (the plan's
            ``generation.tools``); a line's own ``tools`` replace them.
        limit: read at most this many usable prompts (a sample of a huge file;
            ``prompts`` is then at most ``limit``).

    Raises:
        DataFileError: no file holds a single usable prompt (names the first problem).
    """
    reader = PromptReader([Path(p) for p in paths])
    counts: list[int] = []
    for prompt in reader:
        line_tools = prompt.request_fields.get("tools", tools)
        counts.append(
            approx_prompt_tokens(prompt.messages, count_tokens=count_tokens, tools=line_tools)
        )
        if limit is not None and len(counts) >= limit:
            break
    if not counts:
        if reader.problems:
            first = reader.problems[0]
            raise DataFileError(
                first.path, f"no usable prompt; first problem: {first.detail}", line=first.line
            )
        raise DataFileError(
            Path(next(iter(reader.paths), Path("."))), "no prompts in the dataset's files"
        )
    mean = Decimal(sum(counts)) / len(counts)
    return PromptFileStats(
        prompts=len(counts),
        problems=tuple(reader.problems),
        tokens=SampleStats.of(counts) if len(counts) >= 2 else None,
        mean_tokens=mean.quantize(Decimal("0.01")),
        method="approximation" if count_tokens is None else "tokenizer",
    )


def sample_prompts(
    paths: Iterable[str | Path], n: int, *, seed: int = 0
) -> tuple[list[Prompt], int]:
    """A uniform random sample of ``n`` prompts (reservoir sampling: one pass, O(n) memory).

    Returns ``(sample, prompts seen)``; the sample keeps file order, so the same
    seed and files give the same pilot.

    Raises:
        ConfigurationError: ``n`` is not positive.
    """
    if n < 1:
        raise ConfigurationError(f"a pilot needs at least 1 prompt, got {n}")
    rng = random.Random(seed)
    reservoir: list[tuple[int, Prompt]] = []
    seen = 0
    for prompt in PromptReader([Path(p) for p in paths]):
        if len(reservoir) < n:
            reservoir.append((seen, prompt))
        else:
            slot = rng.randrange(seen + 1)
            if slot < n:
                reservoir[slot] = (seen, prompt)
        seen += 1
    reservoir.sort(key=lambda item: item[0])
    return [prompt for _, prompt in reservoir], seen


@dataclass(frozen=True, slots=True)
class PilotResult:
    """What a pilot measured.

    Attributes:
        usages: the ``usage`` of every request that completed.
        failures: requests that failed (their errors are logged as ``pilot.failed``).
        cost: USD the pilot spent (OpenRouter's ``usage.cost``).
        providers: completed requests per serving provider.
        completion: statistics of output tokens per response (reasoning included).
        estimate: the workload it implies, with the CI of the mean response length.
        truncated: completed answers cut at ``max_tokens`` (``finish_reason: length``):
            the share the chosen ``max_tokens`` would cut of the job's answers.
        floor_cost: what its answers' tokens cost at the floor's prices (the cheapest
            allowed endpoint's).
    """

    usages: tuple[Usage, ...]
    failures: int
    cost: Decimal
    providers: Mapping[str, int]
    completion: SampleStats
    estimate: WorkloadEstimate
    truncated: int = 0
    floor_cost: Decimal = Decimal(0)

    @property
    def price_vs_floor(self) -> Decimal | None:
        """``cost / floor_cost``: the premium the pilot paid over the floor. A pilot runs
        few requests at once, so little spills: a lower bound for a loaded run (whose
        bound above is ``1 + max_premium``)."""
        if not self.floor_cost:
            return None
        return (self.cost / self.floor_cost).quantize(Decimal("0.0001"))

    @property
    def requests(self) -> int:
        """Requests that completed."""
        return len(self.usages)

    @property
    def truncated_share(self) -> Estimate:
        """The share of answers cut at ``max_tokens``, with its Wilson 95 % interval."""
        return share_estimate(self.truncated, self.requests)


async def run_pilot(
    router: Router,
    prompts: Iterable[Prompt | Sequence[Message]],
    *,
    max_tokens: int,
    concurrency: int = 16,
    confidence: float = 0.95,
    params: Mapping[str, Any] | None = None,
) -> PilotResult:
    """Send ``prompts`` through ``router`` and measure what comes back.

    Requests that fail are counted, not retried beyond the router's own policy;
    a pilot whose router runs out of credits stops and uses what it measured.

    Args:
        router: an open :class:`~provider_router.Router` (its ledger, if any,
            caps what the pilot spends).
        prompts: the prompts to send (e.g. from :func:`sample_prompts`).
        max_tokens: the completion cap, as the real run will use it (it shapes
            the lengths you measure).
        concurrency: requests in flight.
        confidence: of the response-length interval.
        params: further request fields (``temperature``, ``reasoning``...), as the
            real run will send them.

    Raises:
        ConfigurationError: fewer than two requests completed (no interval).
    """
    if concurrency < 1:
        raise ConfigurationError(f"pilot concurrency must be ≥ 1, got {concurrency}")
    extra = dict(params or {})
    gate = asyncio.Semaphore(concurrency)
    usages: list[Usage] = []
    providers: Counter[str] = Counter()
    cost = floor = Decimal(0)
    failures = truncated = 0

    async def one(prompt: Prompt | Sequence[Message]) -> None:
        nonlocal cost, floor, failures, truncated
        messages = prompt.messages if isinstance(prompt, Prompt) else prompt
        key = prompt.id if isinstance(prompt, Prompt) else None
        # A line's own tools / tool_choice are sent with it, as the run will.
        fields = prompt.request_fields if isinstance(prompt, Prompt) else None
        params = {**extra, **fields} if fields else extra
        async with gate:
            if router.stopped is not None:
                failures += 1
                return
            try:
                result = await router.chat(messages, max_tokens=max_tokens, key=key, **params)
            except ProviderRouterError as exc:
                failures += 1
                log.warning("pilot.failed", key=key, error_type=type(exc).__name__)
                return
        if result.usage is None:
            failures += 1
            return
        usages.append(result.usage)
        providers[result.provider or "unknown"] += 1
        cost += result.cost or Decimal(0)
        truncated += result.finish_reason == "length"
        floor += result.floor_cost or result.cost or Decimal(0)

    await asyncio.gather(*(one(p) for p in prompts))
    log.info("pilot.done", requests=len(usages), failures=failures, cost=str(cost))
    return pilot_result(
        usages,
        providers,
        cost,
        failures,
        confidence=confidence,
        truncated=truncated,
        floor_cost=floor,
    )


def pilot_result(
    usages: Sequence[Usage],
    providers: Mapping[str, int],
    cost: Decimal,
    failures: int,
    *,
    confidence: float = 0.95,
    truncated: int = 0,
    floor_cost: Decimal = Decimal(0),
) -> PilotResult:
    """What a pilot's answers measure (``usages``: each completed request's ``usage``;
    ``truncated``: how many of those answers were cut at ``max_tokens``; ``floor_cost``:
    their tokens at the floor's prices).

    Raises:
        ConfigurationError: fewer than two requests completed (no interval).
    """
    if len(usages) < 2:
        raise ConfigurationError(
            f"the pilot completed {len(usages)} request(s) ({failures} failed): "
            "at least 2 are needed to estimate response lengths"
        )
    estimate = estimate_from_samples(
        [u.prompt_tokens for u in usages],
        [u.completion_tokens for u in usages],
        reasoning_tokens=[u.reasoning_tokens for u in usages],
        cached_tokens=[u.cached_tokens for u in usages],
        confidence=confidence,
    )
    return PilotResult(
        usages=tuple(usages),
        failures=failures,
        cost=cost,
        providers=dict(providers),
        completion=SampleStats.of([u.completion_tokens for u in usages], confidence=confidence),
        estimate=estimate,
        truncated=truncated,
        floor_cost=floor_cost,
    )


_ENCODE: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str).encode
_MAX_REMEMBERED: Final = 5_000_000
"""Distinct prefixes remembered (8 bytes of hash each in a set) before the walk refuses."""


class PrefixShare:
    """What :func:`shared_prefix_share` found.

    Attributes:
        prompts: prompts walked.
        prompt_tokens: their prompt tokens (estimated).
        cached_tokens: tokens of the prefixes an earlier prompt had already sent.
    """

    __slots__ = ("cached_tokens", "prompt_tokens", "prompts")

    def __init__(self, prompts: int, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompts = prompts
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens

    @property
    def share(self) -> Decimal:
        """Cached over prompt tokens (0 when there are none): a ``cached_prompt_share``."""
        if not self.prompt_tokens:
            return Decimal(0)
        return Decimal(self.cached_tokens) / Decimal(self.prompt_tokens)

    def __repr__(self) -> str:
        return (
            f"PrefixShare(prompts={self.prompts}, prompt_tokens={self.prompt_tokens}, "
            f"cached_tokens={self.cached_tokens}, share={float(self.share):.4f})"
        )


def shared_prefix_share(
    prompts: Iterable[Sequence[Message]],
    *,
    min_tokens: int = 0,
    count_tokens: TokenCounter | None = None,
) -> PrefixShare:
    """Walk ``prompts`` in send order and count the tokens earlier prompts already sent.

    Args:
        prompts: each request's messages, in the order they are sent.
        min_tokens: prefixes shorter than this are neither cached nor read.
        count_tokens: a real tokenizer (default: the four-characters approximation).

    Raises:
        ConfigurationError: more distinct prefixes than can be remembered.
    """
    if min_tokens < 0:
        raise ConfigurationError(f"min_tokens must be ≥ 0, got {min_tokens}")
    empty = approx_prompt_tokens([], count_tokens=count_tokens)
    seen: set[int] = set()
    count = total = cached = 0
    for messages in prompts:
        count += 1
        key = 0
        tokens = 0
        read = 0
        boundaries: list[int] = []
        for message in messages:
            key = hash((key, _ENCODE(message)))
            tokens += approx_prompt_tokens([message], count_tokens=count_tokens) - empty
            if tokens >= min_tokens:
                if key in seen:
                    read = tokens
                boundaries.append(key)
        seen.update(boundaries)
        if len(seen) > _MAX_REMEMBERED:
            raise ConfigurationError(
                f"more than {_MAX_REMEMBERED:,} distinct prompt prefixes: estimate the cache "
                "share on a sample of the prompts"
            )
        total += tokens + empty
        cached += read
    return PrefixShare(count, total, cached)
