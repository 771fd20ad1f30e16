"""A job knows what it is: a resume that would change what its outputs answer is refused.

``DIR/job.json`` (:mod:`~provider_router.jobs.store.manifest`) holds the job's model,
policy, and each dataset's route, generation parameters and prompt files. Before anything
is sent a run's plan is compared with it (:func:`check_identity`): on a job with outputs,
another model, policy, route or generation parameters is refused (exit 2), naming each
difference and the two ways out (the job's values, or another ``--out``). Prompt files
new to a job with outputs are refused unless added (``--add-inputs``): the same command
with a wrong ``--out`` would spend one job's budget on another's prompts. A directory
from before manifests is adopted: its rows say which model they answer, this run's policy
and parameters become the job's. :func:`settle_identity` writes the manifest, locked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provider_router._exceptions import DataFileError, JobRefused
from provider_router.jobs.store._layout import MANIFEST_FILE, JobLayout
from provider_router.jobs.store.manifest import (
    DatasetManifest,
    JobManifest,
    read_manifest,
    write_manifest,
)
from provider_router.planning.plan import Plan

__all__ = ["IdentityCheck", "check_identity", "manifest_of", "settle_identity"]

_FLAGS = {
    ("model",): "--model",
    ("policy", "exclude_below"): "--exclude-below",
    ("generation", "max_tokens"): "--max-tokens",
    ("generation", "temperature"): "--temperature",
}
"""What ``provider-router run`` calls a value, where a flag sets it."""
_NAMED = 3
"""Files a sentence names before it says how many more."""


def manifest_of(plan: Plan) -> JobManifest:
    """What ``plan`` would make the job: its model, policy and datasets."""
    datasets = {
        spec.name: DatasetManifest(
            route=spec.route,
            generation=_plain(plan.params_for(spec).request_params()),
            inputs=tuple(str(Path(p).resolve()) for p in spec.inputs),
        )
        for spec in plan.datasets
    }
    return JobManifest(model=plan.model, policy=_plain(plan.policy), datasets=datasets)


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as JSON gives it back (tuples as lists, unset fields out)."""
    plain = json.loads(json.dumps(dict(value), default=str))
    return {k: v for k, v in plain.items() if v is not None}


@dataclass(slots=True)
class IdentityCheck:
    """What :func:`check_identity` found.

    Attributes:
        job: the manifest as the job directory holds it (None: none yet).
        manifest: what the job is once this run starts (to write).
        sentences: what to tell the operator (an adoption, prompt files added).
    """

    job: JobManifest | None
    manifest: JobManifest
    sentences: list[str] = field(default_factory=list)

    def write(self, out: str | Path) -> list[str]:
        """Write the manifest into ``out`` (holding its lock, once nothing refuses the
        run); what to tell the operator."""
        write_manifest(Path(out), self.manifest)
        return self.sentences


def _with_outputs(layout: JobLayout, names: Iterable[str]) -> set[str]:
    """The datasets of ``names`` that hold answers: a non-empty output file, or prompts in
    a Batch API batch that may still answer."""
    found = set()
    for name in names:
        try:
            if layout.output(name).stat().st_size > 0:
                found.add(name)
        except OSError:
            continue
    return found | _in_live_batches(layout)


def _in_live_batches(layout: JobLayout) -> set[str]:
    """Datasets with a batch not yet collected or ended (``batches.jsonl``, read only)."""
    try:
        data = layout.batch_journal.read_bytes()
    except OSError:
        return set()
    live: dict[str, str] = {}
    for line in data.splitlines():
        try:
            entry = json.loads(line)
            if entry["op"] == "intent":
                live[str(entry["intent"])] = str(entry["ds"])
            elif entry["op"] in ("collected", "ended"):
                live.pop(str(entry["intent"]), None)
        except (ValueError, KeyError, TypeError):
            continue  # a torn line: the route's own journal says what it is
    return set(live.values())


def _legacy_models(layout: JobLayout, names: Iterable[str]) -> dict[str, int]:
    """The models the rows of a directory written before manifests answer (how many each)."""
    models: dict[str, int] = {}
    for path in sorted({*layout.outputs(), *(layout.output(n) for n in names)}):
        if not path.is_file():
            continue
        with path.open("rb") as fh:
            for line in fh:
                try:
                    model = json.loads(line).get("model")
                except (ValueError, AttributeError):
                    continue  # a torn line: the journal's repair decides about it
                if isinstance(model, str):
                    models[model] = models.get(model, 0) + 1
    return models


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclass(slots=True)
class _Difference:
    where: tuple[str, ...]
    job: Any
    run: Any
    dataset: str | None = None

    def said(self) -> str:
        what = ".".join(self.where)
        if self.dataset is not None:
            what = f"dataset {self.dataset} {what}"
        return f"{what}: the job's {_show(self.job)}, this run's {_show(self.run)}"

    def way_back(self) -> str:
        flag = _FLAGS.get(self.where)
        if flag is not None:
            return f"without {flag}" if self.job is None else f"{flag} {_show(self.job)}"
        key = ".".join(self.where)
        if self.dataset is not None:
            key = f"dataset {self.dataset}'s {key}"
        return f"{key} unset" if self.job is None else f"{key}: {_show(self.job)}"


def _larger_cap(key: str, job: Any, run: Any) -> bool:
    """Whether ``run`` raises the ``max_tokens`` cap ``job`` had (``--redo-truncated``)."""
    return key == "max_tokens" and isinstance(job, int) and isinstance(run, int) and run > job


def _differences(
    job: JobManifest, run: JobManifest, outputs: set[str], *, cap_may_grow: bool = False
) -> list[_Difference]:
    found: list[_Difference] = []
    if outputs and job.model != run.model:
        found.append(_Difference(("model",), job.model, run.model))
    if outputs:
        for key in sorted(set(job.policy) | set(run.policy)):
            if job.policy.get(key) != run.policy.get(key):
                found.append(_Difference(("policy", key), job.policy.get(key), run.policy.get(key)))
    for name, dataset in run.datasets.items():
        had = job.datasets.get(name)
        if had is None or name not in outputs:
            continue
        if had.route != dataset.route:
            found.append(_Difference(("route",), had.route, dataset.route, name))
        for key in sorted(set(had.generation) | set(dataset.generation)):
            before, now = had.generation.get(key), dataset.generation.get(key)
            if before != now and not (cap_may_grow and _larger_cap(key, before, now)):
                found.append(
                    _Difference(
                        ("generation", key),
                        had.generation.get(key),
                        dataset.generation.get(key),
                        name,
                    )
                )
    return found


def _check_cap_grows(job: JobManifest, run: JobManifest, outputs: set[str]) -> None:
    """``--redo-truncated`` with a cap no larger than a dataset's: refused, said plainly."""
    for name, dataset in run.datasets.items():
        had = job.datasets.get(name)
        if had is None or name not in outputs:
            continue
        before, now = had.generation.get("max_tokens"), dataset.generation.get("max_tokens")
        if isinstance(before, int) and isinstance(now, int) and now <= before:
            raise JobRefused(
                f"--redo-truncated sends the answers of dataset {name} cut at its "
                f"max_tokens {before:,} again with a larger cap; this run's {now:,} is not "
                f"larger: they would be cut again. Give a larger --max-tokens, e.g. "
                f"--max-tokens {2 * before}; nothing was sent"
            )


def _files(paths: Iterable[str]) -> str:
    paths = list(paths)
    shown = ", ".join(paths[:_NAMED])
    return shown if len(paths) <= _NAMED else f"{shown} and {len(paths) - _NAMED} more"


def _new_inputs(job: JobManifest, run: JobManifest) -> list[str]:
    """Each dataset of ``run`` that is new to ``job`` or reads other files, said."""
    said = []
    for name, dataset in run.datasets.items():
        had = job.datasets.get(name)
        if had is None:
            said.append(f"dataset {name} ({_files(dataset.inputs)})")
        elif had.inputs != dataset.inputs:
            said.append(
                f"dataset {name} reading {_files(dataset.inputs)} instead of {_files(had.inputs)}"
            )
    return said


def check_identity(
    plan: Plan, out: str | Path, *, add_inputs: bool = False, redo_truncated: bool = False
) -> IdentityCheck:
    """Compare ``plan`` with the job in ``out`` before anything is sent (module docstring).
    ``redo_truncated``: a larger ``max_tokens`` is allowed (the answers cut at the job's
    cap are sent again with it: :mod:`provider_router.jobs.redo`; the others stand, an
    answer that ended on its own being one a larger cap also allows).

    Raises:
        JobRefused: the run would change what the job's outputs answer (its model, policy,
            or a dataset's route or generation parameters), or give a job with outputs new
            prompt files without ``add_inputs``; or ``DIR/job.json`` is damaged.
    """
    layout = JobLayout(Path(out))
    run = manifest_of(plan)
    try:
        job = read_manifest(layout.out)
    except DataFileError as exc:
        raise JobRefused(str(exc)) from None
    names = set(run.datasets) | (set(job.datasets) if job is not None else set())
    outputs = _with_outputs(layout, names)
    if job is None:
        return _adopt(layout, run, outputs)
    if redo_truncated:
        _check_cap_grows(job, run, outputs)
    differences = _differences(job, run, outputs, cap_may_grow=redo_truncated)
    if differences:
        raised = any(_larger_cap(d.where[-1], d.job, d.run) for d in differences)
        redo = (
            " (to send again only the answers cut at the job's max_tokens, with the larger "
            "one, add --redo-truncated)"
            if raised
            else ""
        )
        raise JobRefused(
            f"{layout.out} holds a job with outputs, and this run would change what they "
            f"answer: {'; '.join(d.said() for d in differences)}. Run it with the job's "
            f"values ({', '.join(d.way_back() for d in differences)}){redo}, or give this "
            "run another --out for a new job; nothing was sent"
        )
    sentences = []
    added = _new_inputs(job, run)
    if added and outputs:
        if not add_inputs:
            raise JobRefused(
                f"{layout.out} holds a job with outputs, and this run gives it prompt files it "
                f"does not have: {'; '.join(added)}. Add them to this job with --add-inputs, "
                "or give this run another --out for a new job; nothing was sent"
            )
        sentences.append(f"prompt files added to the job in {layout.out}: {'; '.join(added)}")
    datasets = {**job.datasets, **run.datasets}
    return IdentityCheck(job, JobManifest(run.model, run.policy, datasets), sentences)


def _adopt(layout: JobLayout, run: JobManifest, outputs: set[str]) -> IdentityCheck:
    """A new job, or one written before manifests: it becomes the job this run says,
    unless its rows answer another model."""
    if not outputs:
        return IdentityCheck(None, run)
    models = _legacy_models(layout, run.datasets)
    if models and run.model not in models:
        found = ", ".join(f"{m} ({n} rows)" for m, n in sorted(models.items()))
        raise JobRefused(
            f"{layout.out} holds outputs of {found}, written before jobs kept a "
            f"{MANIFEST_FILE}; this run asks for {run.model}. Run it with the model they "
            f"answer (--model {max(models, key=lambda m: models[m])}), or give this run "
            "another --out for a new job; nothing was sent"
        )
    others = sorted(m for m in models if m != run.model)
    mixed = (
        f"; its rows of {', '.join(others)} do not answer it: they are moved aside and sent again"
        if others
        else ""
    )
    return IdentityCheck(
        None,
        run,
        [
            f"{layout.out} was written before jobs kept a {MANIFEST_FILE}: it is now the job "
            f"of {run.model} with this run's policy and parameters{mixed}"
        ],
    )


def settle_identity(
    plan: Plan, out: str | Path, *, add_inputs: bool = True, redo_truncated: bool = False
) -> list[str]:
    """:func:`check_identity`, then write the manifest (call it holding the job directory's
    lock, before anything is sent); what to tell the operator.

    Raises:
        JobRefused: as :func:`check_identity`.
    """
    check = check_identity(plan, out, add_inputs=add_inputs, redo_truncated=redo_truncated)
    return check.write(out)
