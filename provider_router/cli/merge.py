"""``provider-router merge DIR... --out MERGED``: one output per dataset from separate runs.

::

    provider-router merge runs/machine-1 runs/machine-2 runs/machine-3 --out runs/merged [--json]

Each DIR is one run's ``--out`` directory (e.g. a share of the prompts run on
another machine with the same ``--ledger``). Only records their journals
committed are taken, each prompt id once per dataset (the first directory
given wins a duplicate), into ``MERGED/<dataset>.jsonl``; ``MERGED/merge.json``
says what came from where. Merging again rewrites the same result. See
docs/workers.md.
"""

from __future__ import annotations

import argparse

from provider_router._table import Column, FitTable
from provider_router.cli._render import format_usd, make_console, print_json
from provider_router.jobs.store.outputs import merge_outputs

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="merge the outputs of separate runs, each prompt once",
        description=(
            "Merge the job directories of separate runs (say, shares of a job run on "
            "several machines with one --ledger) into one output per dataset, each prompt "
            "exactly once (see docs/workers.md)."
        ),
    )
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="a run's --out directory")
    parser.add_argument("--out", required=True, metavar="MERGED", help="where merged outputs go")
    parser.add_argument("--json", action="store_true", help="print the merge report as JSON")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    report = merge_outputs(args.dirs, args.out)
    if args.json:
        print_json(report.to_json())
        return 0
    table = FitTable(
        Column("dataset", key=True),
        Column("records", "right"),
        Column("duplicates dropped", "right"),
        Column("output tokens", "right", drop=0),
        Column("cost", "right"),
        Column("spent twice", "right"),
        title=f"Merged into {report.out}",
    )
    for name, merged in report.datasets.items():
        table.add_row(
            name,
            f"{merged.records:,}",
            f"{merged.duplicates:,}",
            f"{merged.output_tokens:,}",
            format_usd(merged.cost),
            format_usd(merged.duplicate_cost),
        )
    console = make_console()
    console.print(table)
    if not report.datasets:
        console.print("No completed records in these directories.")
    return 0
