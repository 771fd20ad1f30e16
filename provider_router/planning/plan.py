"""The plan of a batch job: which datasets, how much of each, with what model and money.

A plan comes from a YAML or TOML file (:func:`load_plan`, format in docs/batch.md) or,
for one dataset, from command-line flags (:meth:`Plan.single`); both give the same
:class:`Plan`::

    model: moonshotai/kimi-k2.5
    budget: 100                          # USD, a hard cap for the whole plan
    datasets:
      - name: b3
        inputs: [prompts/magicoder.jsonl]    # relative to the plan file
        target_output_tokens: 7_000_000      # stop this dataset once reached

Errors name the file and, for YAML, the line of the offending value.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from provider_router._constants import (
    DEFAULT_JOB_KEY_HOURS,
    DEFAULT_MAX_PREMIUM,
    REDIS_URL_SCHEMES,
)
from provider_router._exceptions import ConfigurationError, DataFileError
from provider_router._money import LEDGER_MAX_USD, to_decimal
from provider_router.client.admission import check_max_premium

__all__ = [
    "DEFAULT_BATCH_CONCURRENCY",
    "DEFAULT_BATCH_MAX_TOKENS",
    "MAX_CONCURRENCY",
    "DatasetSpec",
    "GenerationParams",
    "Plan",
    "load_plan",
    "reached",
]

DEFAULT_BATCH_CONCURRENCY = 256
"""Requests in flight when neither the plan nor a flag says (the reference job uses 2,000)."""
DEFAULT_BATCH_MAX_TOKENS = 8192
"""Completion-token cap per request when neither the plan nor a flag says."""
MAX_CONCURRENCY = 20_000
"""Requests in flight one process keeps at most: each holds a connection of its own, and
Linux gives a host about 28,000 ports towards one address (``run --ray`` goes wider)."""

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHARED_NAME = re.compile(r"^[^{}\s]{1,128}$")
_REASONING_EFFORTS = frozenset({"max", "xhigh", "high", "medium", "low", "minimal", "none"})
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
# Keys plans no longer take, with what to write instead of pydantic's "extra inputs".
_REMOVED_KEYS = {
    "workers_share": "the Redis-streams fleet was removed: run the plan on Ray "
    "(provider-router run --plan FILE --ray, docs/workers.md), naming the Redis ledger "
    "with ledger_name",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GenerationParams(_Frozen):
    """Sampling parameters sent with every request of a dataset.

    ``reasoning`` takes OpenRouter's object (``{effort: high}``, ``{max_tokens: N}``,
    ``{exclude: true}``, ``{enabled: false}``), an effort word, or a boolean.
    ``tools`` (OpenAI-format tool objects) and ``tool_choice`` (``none``, ``auto``,
    ``required`` or ``{type: function, function: {name: ...}}``) are sent as given;
    a prompt line's own ``tools``/``tool_choice`` override them (docs/batch.md).
    Unset fields (``None``) are not sent, and a dataset's values override the plan's.
    """

    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    reasoning: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    tool_choice: str | dict[str, Any] | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(value, str) and value not in _TOOL_CHOICES:
            raise ValueError(
                f"unknown tool_choice {value!r} (one of: auto, none, required, or "
                "{type: function, function: {name: ...}})"
            )
        if isinstance(value, dict) and not isinstance(value.get("type"), str):
            raise ValueError("tool_choice object needs a 'type' (e.g. 'function')")
        return value

    @field_validator("reasoning", mode="before")
    @classmethod
    def _reasoning(cls, value: object) -> object:
        if value is None or isinstance(value, dict):
            return value
        if isinstance(value, bool):
            return {"enabled": value}
        if isinstance(value, str):
            if value not in _REASONING_EFFORTS:
                efforts = ", ".join(sorted(_REASONING_EFFORTS))
                raise ValueError(f"unknown reasoning effort {value!r} (one of: {efforts})")
            return {"effort": value}
        raise ValueError("reasoning must be an object, an effort word or a boolean")

    def merged(self, override: GenerationParams) -> GenerationParams:
        """These parameters with every field ``override`` sets replacing ours."""
        return self.model_copy(update=override.model_dump(exclude_none=True))

    def request_params(self) -> dict[str, Any]:
        """The request-body fields these parameters send (unset ones left out)."""
        return self.model_dump(exclude_none=True)


class DatasetSpec(_Frozen):
    """One dataset: its prompt files, how much to generate, and its parameters.

    A dataset stops at whichever comes first: its prompts run out, its completed
    output tokens reach ``target_output_tokens``, or ``max_requests`` prompts
    have been completed. Its outputs go to ``<out>/<name>.jsonl``.
    """

    name: str
    inputs: tuple[Path, ...]
    target_output_tokens: int | None = Field(default=None, gt=0)
    max_requests: int | None = Field(default=None, gt=0)
    generation: GenerationParams = GenerationParams()
    route: Literal["sync", "batch", "auto"] = "sync"
    """``batch``: OpenRouter's Batch API; ``auto``: batch where an allowed batch endpoint
    exists and ``deadline_hours`` is not sooner than its 24 h window (docs/batch.md)."""
    deadline_hours: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _input_alias(cls, data: object) -> object:
        if isinstance(data, dict) and "input" in data:
            data = dict(data)
            if "inputs" in data:
                raise ValueError("give `input` or `inputs`, not both")
            data["inputs"] = [data.pop("input")]
        return data

    @field_validator("inputs")
    @classmethod
    def _some_inputs(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        if not value:
            raise ValueError("give at least one prompt file (input: FILE or inputs: [FILE, ...])")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_PATTERN.match(value):
            raise ValueError(
                f"dataset name {value!r} must be 1-64 letters, digits, '_', '.' or '-' "
                "(it names the output file)"
            )
        return value


class Plan(_Frozen):
    """A whole batch job: model, policy, money, concurrency and datasets.

    Attributes:
        model: the OpenRouter model id.
        budget: the hard cap in USD for all datasets together (``None`` only
            until the command line supplies one).
        concurrency: requests in flight at most.
        policy: keyword arguments of :class:`~provider_router.ProviderPolicy`.
        generation: defaults for every dataset's generation parameters.
        datasets: the datasets, in the order their work is interleaved.
        verify_every: with ``run --verify``, rows between two re-verifications of the
            providers (default 1,000; 0: only before the run; docs/policy.md, "Drift").
        ledger: a Redis URL: keep the budget there (shared by every process using
            it) instead of in ``<out>/ledger.sqlite``.
        ledger_name: the shared ledger's name (required with ``ledger``).
        cache_affinity: pin each conversation (its messages up to the first user
            message) to one endpoint so its turns read the provider's prompt cache
            (``Router(cache_affinity=True)``, docs/client.md "Cache-aware pinning").
        max_premium: the most paid above the floor (every token at the cheapest
            allowed endpoint's price), averaged over the run, as a share: ``0.02``
            (the default: cost first, waiting for the cheap endpoints when they are
            full), ``0`` (the floor only) or ``null`` (latency first: the cheapest
            endpoint with room). ``Router(max_premium=...)``, docs/client.md,
            "Cost-first admission".
        job_key: each run makes its own OpenRouter key with what the budget has left as
            its limit, sends with it and disables it at its end (``run --job-key``; needs
            ``OPENROUTER_MANAGEMENT_KEY``; docs/ledger.md, "A key for the job").
        job_key_hours: how long such a key is accepted before it expires.
        response_cache: seconds OpenRouter keeps each answer for a re-send of the
            same prompt (1–86,400; the Router's ``X-OpenRouter-Cache`` headers, docs/client.md
            "Response caching"); ``None`` (the default): off.
        distillable_text: send ``provider.enforce_distillable_text: true``: only models
            whose author allows training on their outputs serve (default on: a job
            generates data; ``false`` opts out, ``run --no-distillable-text``).
        context_compression: let OpenRouter compress prompts that do not fit an
            endpoint (its default on endpoints of 8,192 tokens or less, which drops the
            middle of a prompt); default off: every request says so explicitly. Rows
            compressed anyway are flagged either way (docs/output.md).
    """

    model: str = Field(min_length=1)
    budget: Decimal | None = None
    concurrency: int = Field(default=DEFAULT_BATCH_CONCURRENCY, gt=0)
    policy: dict[str, Any] = Field(default_factory=dict)
    generation: GenerationParams = GenerationParams(max_tokens=DEFAULT_BATCH_MAX_TOKENS)
    datasets: tuple[DatasetSpec, ...]
    ledger: str | None = None
    ledger_name: str | None = None
    cache_affinity: bool = False
    response_cache: int | None = Field(default=None, ge=1, le=86_400)
    verify_every: int | None = Field(default=None, ge=0)
    job_key: bool = False
    job_key_hours: float = Field(default=DEFAULT_JOB_KEY_HOURS, gt=0)
    distillable_text: bool = True
    context_compression: bool = False
    _source: Path | None = PrivateAttr(default=None)
    _lines: dict[tuple[Any, ...], int] = PrivateAttr(default_factory=dict)
    _entries: dict[str, int] = PrivateAttr(default_factory=dict)

    @field_validator("datasets")
    @classmethod
    def _some_datasets(cls, value: tuple[DatasetSpec, ...]) -> tuple[DatasetSpec, ...]:
        # A validator, not min_length: pydantic would say "should have at least 1
        # item" of a list whose one entry is invalid, beside that entry's own problem.
        if not value:
            raise ValueError("a plan needs at least one dataset")
        return value

    @field_validator("concurrency")
    @classmethod
    def _bounded_concurrency(cls, value: int) -> int:
        if value > MAX_CONCURRENCY:
            raise ValueError(
                f"{value:,} requests in flight is more than one process keeps (at most "
                f"{MAX_CONCURRENCY:,}: each holds a connection of its own); run the plan on "
                "Ray (--ray) to go wider"
            )
        return value

    max_premium: Decimal | None = DEFAULT_MAX_PREMIUM

    @field_validator("max_premium", mode="before")
    @classmethod
    def _max_premium(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() == "none":
            return None
        try:
            return check_max_premium(value)  # type: ignore[arg-type]
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("ledger")
    @classmethod
    def _ledger_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(REDIS_URL_SCHEMES):
            raise ValueError(
                f"ledger must be a Redis URL (redis://host:6379/0, rediss://, unix://), "
                f"got {value!r}; without it the ledger is <out>/ledger.sqlite"
            )
        return value

    @field_validator("ledger_name")
    @classmethod
    def _shared_name(cls, value: str | None) -> str | None:
        if value is not None and not _SHARED_NAME.match(value):
            raise ValueError(f"{value!r} must be 1-128 characters without spaces or braces")
        return value

    @model_validator(mode="after")
    def _shared_needs_name(self) -> Plan:
        if self.ledger is not None and self.ledger_name is None:
            raise ValueError("a Redis ledger needs a name: ledger_name (or --ledger-name)")
        return self

    @property
    def shared_ledger_name(self) -> str | None:
        """The Redis ledger's name (``ledger_name``)."""
        return self.ledger_name

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, value: object) -> object:
        if value is None:
            return None
        amount = to_decimal(value, what="budget")
        if amount <= 0:
            raise ValueError("budget must be more than $0")
        if amount > LEDGER_MAX_USD:
            raise ValueError(
                f"budget ${amount} is above the largest a ledger holds exactly "
                f"(${LEDGER_MAX_USD:,}); run it as several jobs"
            )
        return amount

    @model_validator(mode="after")
    def _unique_names(self) -> Plan:
        seen: set[str] = set()
        for dataset in self.datasets:
            if dataset.name in seen:
                raise ValueError(f"dataset name {dataset.name!r} appears twice")
            seen.add(dataset.name)
        return self

    def where(self, dataset: str | None, *keys: str) -> str | None:
        """``FILE:LINE`` of a value in the plan file it was read from (None: not read from
        a file, or the line is unknown): of ``keys`` in dataset ``dataset``, or at the top
        level when ``dataset`` is None. The deepest part the file has is named (a dataset
        entry without ``route`` is named by the entry's own line)."""
        if self._source is None:
            return None
        loc: tuple[Any, ...] = keys
        if dataset is not None:
            index = self._entries.get(dataset)
            if index is None:
                return None
            loc = ("datasets", index, *keys)
        line = _line_for(loc, self._lines)
        return None if line is None else f"{self._source}:{line}"

    def _located(self, source: Path | None, lines: Mapping[tuple[Any, ...], int]) -> Plan:
        """Remember where this plan was read from (:meth:`where`); by dataset name, so a
        copy without some datasets (a route took them) still names the right lines."""
        self._source = source
        self._lines = dict(lines)
        self._entries = {}
        for index, dataset in enumerate(self.datasets):
            self._entries[dataset.name] = index
        return self

    def __eq__(self, other: object) -> bool:
        # Where a plan was read from is not what it is: a plan from flags equals the
        # same plan from a file.
        if not isinstance(other, Plan):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def params_for(self, dataset: DatasetSpec) -> GenerationParams:
        """The generation parameters one dataset actually uses."""
        params = self.generation.merged(dataset.generation)
        if params.max_tokens is None:
            params = params.model_copy(update={"max_tokens": DEFAULT_BATCH_MAX_TOKENS})
        return params

    def dataset(self, name: str) -> DatasetSpec:
        """The dataset called ``name``."""
        for dataset in self.datasets:
            if dataset.name == name:
                return dataset
        raise KeyError(name)

    def with_overrides(
        self,
        *,
        model: str | None = None,
        budget: Decimal | None = None,
        concurrency: int | None = None,
        max_tokens: int | None = None,
        exclude_below: str | None = None,
        target_output_tokens: int | None = None,
        ledger: str | None = None,
        ledger_name: str | None = None,
        max_premium: Decimal | Literal["none"] | None = None,
        response_cache: int | None = None,
        distillable_text: bool | None = None,
    ) -> Plan:
        """This plan with the given command-line values replacing the file's
        (``max_premium="none"``: no cap; ``None``: the file's)."""
        update: dict[str, Any] = {}
        if max_premium is not None:
            update["max_premium"] = None if max_premium == "none" else max_premium
        if response_cache is not None:
            update["response_cache"] = response_cache
        if distillable_text is not None:
            update["distillable_text"] = distillable_text
        for key, value in (("ledger", ledger), ("ledger_name", ledger_name)):
            if value is not None:
                update[key] = value
        if model is not None:
            update["model"] = model
        if budget is not None:
            update["budget"] = budget
        if concurrency is not None:
            update["concurrency"] = concurrency
        if max_tokens is not None:
            update["generation"] = self.generation.model_copy(update={"max_tokens": max_tokens})
        if exclude_below is not None:
            update["policy"] = {**self.policy, "exclude_below": exclude_below}
        if target_output_tokens is not None:
            update["datasets"] = tuple(
                d.model_copy(update={"target_output_tokens": target_output_tokens})
                for d in self.datasets
            )
        data = self.model_dump()
        data.update(update)
        plan = _validate(data, source=None)
        plan._source, plan._lines, plan._entries = self._source, self._lines, self._entries
        return plan

    @classmethod
    def single(
        cls,
        inputs: Sequence[str | Path],
        *,
        model: str,
        budget: Decimal | None,
        name: str | None = None,
        concurrency: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        reasoning: object = None,
        exclude_below: str | None = None,
        target_output_tokens: int | None = None,
        max_requests: int | None = None,
        max_premium: Decimal | Literal["none"] | None = None,
    ) -> Plan:
        """A one-dataset plan from command-line values (the dataset is named after the file;
        ``max_premium="none"``: no cap; ``None``: the default)."""
        paths = [Path(p) for p in inputs]
        if not paths:
            raise ConfigurationError("give a prompts file (PROMPTS.jsonl) or --plan")
        data: dict[str, Any] = {
            "model": model,
            "budget": budget,
            "policy": {"exclude_below": exclude_below} if exclude_below else {},
            "generation": {
                "max_tokens": max_tokens or DEFAULT_BATCH_MAX_TOKENS,
                "temperature": temperature,
                "reasoning": reasoning,
            },
            "datasets": [
                {
                    "name": name or _name_from_path(paths[0]),
                    "inputs": paths,
                    "target_output_tokens": target_output_tokens,
                    "max_requests": max_requests,
                }
            ],
        }
        if concurrency is not None:
            data["concurrency"] = concurrency
        if max_premium is not None:
            data["max_premium"] = None if max_premium == "none" else max_premium
        return _validate(data, source=None)


def reached(dataset: DatasetSpec, completed: int, output_tokens: int) -> bool:
    """Whether a dataset has reached its output-token target or its request cap."""
    target, cap = dataset.target_output_tokens, dataset.max_requests
    return (target is not None and output_tokens >= target) or (
        cap is not None and completed >= cap
    )


def _name_from_path(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).strip("-.") or "prompts"
    if not name[0].isalnum():
        name = "d" + name
    return name[:64]


def _describe(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in error["loc"] if part not in {"__root__"})
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        message = _REMOVED_KEYS.get(str(error["loc"][0]), message)
    return f"{loc}: {message}" if loc else message


def _validate(
    data: Any, *, source: Path | None, lines: Mapping[tuple[Any, ...], int] | None = None
) -> Plan:
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        line = _line_for(tuple(first["loc"]), lines or {}) if source is not None else None
        if len(errors) == 1:
            detail = _describe(first)
        else:
            # Every problem at once, each where it is: one fix-and-retry, not four.
            listed = []
            for error in errors:
                at = _line_for(tuple(error["loc"]), lines or {}) if source is not None else None
                listed.append(("" if at is None else f"line {at}: ") + _describe(error))
            detail = f"{len(errors)} problems:\n  " + "\n  ".join(listed)
        if source is None:
            raise ConfigurationError(f"invalid plan: {detail}") from None
        raise DataFileError(source, f"invalid plan: {detail}", line=line) from None


def _line_for(loc: tuple[Any, ...], lines: Mapping[tuple[Any, ...], int]) -> int | None:
    # The deepest ancestor of the error's location that the YAML parser saw.
    for end in range(len(loc), -1, -1):
        line = lines.get(loc[:end])
        if line is not None:
            return line
    return None


def _yaml_lines(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            _yaml_lines(value, (*path, key.value), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _yaml_lines(item, (*path, index), out)


def _read_yaml(path: Path, text: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise DataFileError(path, f"not valid YAML: {exc.problem or exc}", line=line) from None
    except yaml.YAMLError as exc:
        raise DataFileError(path, f"not valid YAML: {exc}") from None
    lines: dict[tuple[Any, ...], int] = {}
    if node is not None:
        _yaml_lines(node, (), lines)
    return data, lines


def _read_toml(path: Path, text: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        line = int(found.group(1)) if found else None
        raise DataFileError(path, f"not valid TOML: {message}", line=line) from None


def load_plan(path: str | Path) -> Plan:
    """Read a plan from a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file.

    Input paths in the file are relative to the file's directory.

    Raises:
        DataFileError: the file is unreadable, not YAML/TOML, or not a valid plan;
            the message names the file, the line where known, and the field.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in {".yaml", ".yml", ".toml"}:
        raise DataFileError(path, "a plan file must end in .yaml, .yml or .toml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataFileError(path, f"cannot read plan file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(path, f"plan file is not UTF-8 text (byte {exc.start})") from None
    lines: dict[tuple[Any, ...], int] = {}
    if suffix in {".yaml", ".yml"}:
        data, lines = _read_yaml(path, text)
    else:
        data = _read_toml(path, text)
    if not isinstance(data, dict):
        raise DataFileError(path, "a plan must be a mapping with `model` and `datasets`", line=1)
    datasets = data.get("datasets")
    if isinstance(datasets, list):
        base = path.parent
        for entry in datasets:
            if isinstance(entry, dict):
                for key in ("input", "inputs"):
                    value = entry.get(key)
                    if isinstance(value, str):
                        entry[key] = str(base / value)
                    elif isinstance(value, list):
                        entry[key] = [str(base / v) if isinstance(v, str) else v for v in value]
    return _validate(data, source=path, lines=lines)._located(path, lines)
