"""What a run is given, checked before anything is sent or written.

Every prompt file must hold a usable prompt, the job directory must be (or become)
a directory we may write to, there must be an API key and a budget, and the options
must fit the plan. A failed check raises :class:`~provider_router.JobRefused` (a
:class:`~provider_router.ConfigurationError`) naming what to change; only then is
the job directory made. ``provider-router run`` turns it into a usage error (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path

from provider_router._constants import ENV_API_KEY, ENV_MANAGEMENT_KEY
from provider_router._exceptions import JobRefused
from provider_router.jobs.identity import check_identity
from provider_router.planning.plan import Plan
from provider_router.planning.prompts import PromptReader
from provider_router.routing.policy import ProviderPolicy

__all__ = ["check_inputs", "check_out", "check_run"]


def check_run(
    plan: Plan,
    out: str | Path,
    *,
    api_key: str | None = None,
    verify: bool = False,
    verify_every: int | None = None,
    add_inputs: bool = False,
    redo_truncated: bool = False,
    job_key: bool = False,
    own_key: bool = False,
) -> None:
    """Everything :func:`~provider_router.jobs.run_plan` checks before it starts, in order:
    the budget, the prompt files, the key (``api_key``, else ``OPENROUTER_API_KEY``; with
    ``job_key``, a management key in ``OPENROUTER_MANAGEMENT_KEY`` instead), the policy,
    ``verify`` against the plan's routes, ``out`` (made if missing), then the job in it
    (:func:`~provider_router.jobs.identity.check_identity`: ``add_inputs`` lets the run
    give a job with outputs new prompt files, ``redo_truncated`` a larger ``max_tokens``).

    Raises:
        JobRefused: what cannot be used, and what to change.
        ConfigurationError: the plan's policy is not a valid :class:`ProviderPolicy`.
    """
    if plan.budget is None:
        raise JobRefused("a run needs a budget (--budget USD or `budget:` in the plan)")
    check_inputs(plan)
    if job_key:
        _check_job_key(plan, own_key=own_key)
    elif not (api_key or os.environ.get(ENV_API_KEY)):
        raise JobRefused(
            f"no API key: set {ENV_API_KEY} to your OpenRouter key "
            f"(export {ENV_API_KEY}=sk-or-...; create one at https://openrouter.ai/keys)"
        )
    ProviderPolicy(**plan.policy)
    if verify and any(d.route != "sync" for d in plan.datasets):
        raise JobRefused(
            "--verify measures the providers of the sync route before a run on one machine; "
            "with --ray or a batch-route dataset run provider-router verify first instead"
        )
    if verify_every is not None and not verify:
        raise JobRefused("--verify-every N re-checks the providers of a run with --verify: add it")
    check_out(Path(out))
    check_identity(plan, out, add_inputs=add_inputs, redo_truncated=redo_truncated)


def _check_job_key(plan: Plan, *, own_key: bool) -> None:
    """``--job-key``: a management key, and a run its per-run key can serve whole."""
    if not os.environ.get(ENV_MANAGEMENT_KEY, "").strip():
        raise JobRefused(
            f"--job-key makes a key for the run with a management key: set "
            f"{ENV_MANAGEMENT_KEY} (create one at https://openrouter.ai/settings/management-keys)"
        )
    if any(d.route != "sync" for d in plan.datasets):
        raise JobRefused(
            "--job-key: a batch outlives the run that sent it and is read back with the key "
            "that made it; run route: batch and route: auto datasets without --job-key"
        )
    if own_key:
        raise JobRefused(
            "--own-key bounds worst cases by one key's usage across runs, and --job-key makes "
            "a new key for each run: use one or the other"
        )


def check_inputs(plan: Plan) -> None:
    """Every prompt file of the plan is a readable file with a usable prompt (else
    nothing would be sent).

    Raises:
        JobRefused: the first file that is missing, unreadable or without a usable line.
    """
    for dataset in plan.datasets:
        for path in dataset.inputs:
            if not path.is_file():
                problem = "is a directory" if path.is_dir() else "does not exist"
                raise JobRefused(f"prompt file {path} of dataset {dataset.name!r} {problem}")
            if not os.access(path, os.R_OK):
                raise JobRefused(f"prompt file {path} is not readable")
        # Reads up to the first good line: cheap, unless every line is bad.
        reader = PromptReader(list(dataset.inputs))
        if next(iter(reader), None) is None:
            files = ", ".join(str(p) for p in dataset.inputs)
            why = f"; first problem: {reader.problems[0]}" if reader.problems else " (empty)"
            raise JobRefused(f"no usable prompt in dataset {dataset.name!r} ({files}){why}")


def check_out(out: str | Path) -> None:
    """The job directory is (or can become) a directory we may write to; it is made here.

    Raises:
        JobRefused: it is a file, cannot be made, or is not writable.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise JobRefused(f"--out {out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JobRefused(
            f"--out {out}: cannot create the directory ({exc.strerror or exc})"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise JobRefused(f"--out {out} is not writable")
