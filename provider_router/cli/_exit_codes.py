"""The exit code of ``provider-router run`` for each way a run ends.

A run's library outcome is a :class:`~provider_router.jobs.summary.StopReason`; the
number is the command line's. It is also noted in the job's ``summary.json``
(``exit_code``, which ``provider-router status`` shows), by the command that ran it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

from provider_router.jobs.summary import StopReason

__all__ = ["EXIT_CODES", "exit_code", "note_exit_code"]

EXIT_CODES: Mapping[StopReason, int] = {
    StopReason.COMPLETE: 0,
    StopReason.ERROR: 1,
    StopReason.BUDGET: 3,
    StopReason.CREDITS: 4,
    StopReason.INCOMPLETE: 5,
    StopReason.TARGET_NOT_REACHED: 6,
    StopReason.INTERRUPTED: 130,
    StopReason.ABANDONED: 130,
}
"""The ``provider-router run`` exit code for each way a run can end."""


def exit_code(reason: StopReason) -> int:
    """The command's exit code for a run that ended for ``reason``."""
    return EXIT_CODES[reason]


def note_exit_code(summary_file: Path) -> None:
    """Add the exit code of the run's ``reason`` to ``summary_file`` (just after it),
    rewritten atomically. A file that cannot be read or written is left as it is: that
    costs ``status`` the number, never the run its work."""
    try:
        document = json.loads(summary_file.read_text(encoding="utf-8"))
        reason = StopReason(document["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    noted: dict[str, object] = {}
    for key, value in document.items():
        if key != "exit_code":
            noted[key] = value
        if key == "reason":
            noted["exit_code"] = exit_code(reason)
    tmp = summary_file.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(noted, indent=2) + "\n", encoding="utf-8")
        tmp.replace(summary_file)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
