"""``provider-router export``: outputs as EAGLE-3 / SpecForge training conversations.

::

    provider-router export DIR [DIR/b3.jsonl ...] --to train.jsonl [--force] [--reasoning]
        [--all-finishes]

Each argument is a job directory (every ``<dataset>.jsonl`` in it) or an output
file. Writes ``{"id": "<dataset>/<id>", "conversations": [...]}`` lines; see
docs/output.md. An existing ``--to`` file is kept unless ``--force`` says to overwrite it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from provider_router.cli._errors import UsageError
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.outputs import COMPLETE_FINISHES, export_conversations

__all__ = ["output_files", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export run outputs as EAGLE-3 / SpecForge `conversations` JSONL",
        description=(
            "Write the records of job directories or output files as training conversations "
            "({id, conversations: [{role, content}...]}), SpecForge's format."
        ),
    )
    parser.add_argument("sources", nargs="+", metavar="DIR|FILE", help="job dirs or outputs")
    parser.add_argument("--to", required=True, metavar="FILE", help="where to write ('-': stdout)")
    parser.add_argument(
        "--force", action="store_true", help="overwrite --to if it exists (default: refuse)"
    )
    parser.add_argument(
        "--reasoning", action="store_true", help="keep reasoning as `reasoning_content`"
    )
    parser.add_argument(
        "--all-finishes",
        action="store_true",
        help="keep truncated replies too (default: only finish_reason stop or tool_calls)",
    )
    parser.add_argument(
        "--keep-flagged",
        action="store_true",
        help="keep flagged rows: drift_flagged (run --verify: their provider failed a later "
        "check) and context_compressed (OpenRouter cut their prompt); default: left out "
        "and counted",
    )
    parser.set_defaults(handler=_handle)


def output_files(sources: list[str]) -> list[Path]:
    """The output files named by ``sources`` (directories expand to their datasets)."""
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = JobLayout(path).outputs()
            if not found:
                raise UsageError(f"{path} holds no output files (<dataset>.jsonl)")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{path} is neither a job directory nor an output file")
    return files


def _handle(args: argparse.Namespace) -> int:
    files = output_files(args.sources)
    finishes = None if args.all_finishes else COMPLETE_FINISHES
    if args.to == "-":
        report = export_conversations(
            files,
            sys.stdout,
            reasoning=args.reasoning,
            finish_reasons=finishes,
            flagged=args.keep_flagged,
        )
    else:
        # Exclusive creation: refused at once if the file is there, even one made
        # since we looked.
        try:
            with open(args.to, "w" if args.force else "x", encoding="utf-8") as out:
                report = export_conversations(
                    files,
                    out,
                    reasoning=args.reasoning,
                    finish_reasons=finishes,
                    flagged=args.keep_flagged,
                )
        except FileExistsError:
            raise UsageError(
                f"--to {args.to} exists: give --force to overwrite it, or another file"
            ) from None
    skipped = ", ".join(f"{reason}: {n}" for reason, n in sorted(report.skipped.items()))
    print(
        f"exported {report.written} conversation(s) from {len(files)} file(s)"
        + (f"; skipped {skipped}" if skipped else ""),
        file=sys.stderr,
    )
    return 0
