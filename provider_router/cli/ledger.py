"""``provider-router ledger``: look at a budget ledger, or top it up.

::

    provider-router ledger show runs/b3.ledger [--json]
    provider-router ledger show runs/b3                       (a job directory: its ledger.sqlite)
    provider-router ledger show redis://host:6379/0 --name b3
    provider-router ledger topup runs/b3.ledger --limit 150     (or --add 50)

Amounts are exact (this is the accounting view), never with an exponent. A target
starting with ``redis://``, ``rediss://`` or ``unix://`` is a Redis ledger; anything
else is a SQLite file, which must already exist. ``show`` on a job's ``ledger.sqlite``
also lists the answers whose ``usage.cost`` was disputed, read from the job's journal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from provider_router._constants import REDIS_URL_SCHEMES
from provider_router._format import decimal_str, format_usd
from provider_router._money import LEDGER_MAX_USD
from provider_router.cli._errors import UsageError
from provider_router.cli._options import non_negative_usd, positive_usd
from provider_router.cli._render import make_console, print_json, print_wrapped
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.summary import disputed_line
from provider_router.ledger import LedgerState, RedisLedger, Reservation, SQLiteLedger
from provider_router.ledger._durable import DurableLedger

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("ledger", help="show or top up a budget ledger")
    commands = parser.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)

    show = commands.add_parser("show", help="limit, spent, reserved and open reservations")
    _add_target(show, job_directory=True)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(handler=_show)

    topup = commands.add_parser("topup", help="change the budget")
    _add_target(topup)
    amount = topup.add_mutually_exclusive_group(required=True)
    amount.add_argument("--limit", type=non_negative_usd, help="the new limit in USD")
    amount.add_argument("--add", type=positive_usd, help="USD to add to the current limit")
    topup.set_defaults(handler=_topup)


def _add_target(parser: argparse.ArgumentParser, *, job_directory: bool = False) -> None:
    directory = " a job directory (its ledger.sqlite)," if job_directory else ""
    parser.add_argument("target", help=f"a SQLite ledger file,{directory} or a redis:// URL")
    parser.add_argument("--name", default=None, help="the ledger's name (Redis only)")


def _open(args: argparse.Namespace) -> DurableLedger:
    target: str = args.target
    if target.startswith(REDIS_URL_SCHEMES):
        if not args.name:
            raise UsageError("a Redis ledger needs --name")
        return RedisLedger(target, args.name)
    if args.name:
        raise UsageError("--name is for Redis ledgers; a SQLite file is its own name")
    if not Path(target).is_file():
        raise UsageError(f"no ledger file at {target}")
    return SQLiteLedger(target)


def _job_ledger(target: str) -> str:
    """``target``, or the ledger of the job directory ``target`` names."""
    if target.startswith(REDIS_URL_SCHEMES) or not Path(target).is_dir():
        return target
    ledger = JobLayout(Path(target)).ledger
    if not ledger.is_file():
        raise UsageError(
            f"{target} is a directory without a job ledger ({ledger.name}): give a ledger "
            "file or a run's --out directory"
        )
    return str(ledger)


def _show(args: argparse.Namespace) -> int:
    args.target = _job_ledger(args.target)

    async def read() -> tuple[LedgerState, list[Reservation]]:
        async with _open(args) as ledger:
            return await ledger.snapshot(), await ledger.open_reservations()

    state, open_ = asyncio.run(read())
    disputed = _disputed(args.target)
    if args.json:
        print_json(
            {
                **_state_dict(state),
                "open_reservations": [_res_dict(r) for r in open_],
                "disputed": disputed,
            }
        )
        return 0
    console = make_console()
    lines = [
        f"limit      ${decimal_str(state.limit)}",
        f"spent      ${decimal_str(state.spent)}",
        f"reserved   ${decimal_str(state.reserved)}  ({state.open} open)",
        f"available  ${decimal_str(state.available)}",
        *_history_lines(state),
        *(
            f"  open {res.id}  ${decimal_str(res.amount)}  key={res.key}"
            f"  generation={res.generation_id or '-'}  owner={res.owner}"
            for res in open_
        ),
        *(f"  disputed {line}" for line in disputed),
    ]
    for line in lines:
        print_wrapped(console, line, hang=None if line.startswith(" ") else len("available  "))
    return 0


def _history_lines(state: LedgerState) -> list[str]:
    """What the ledger's counters mean, in words; a line that would say "0" is left out."""
    requests = f"requests   {state.settled:,} charged, {state.released:,} released free"
    if state.recovered:
        requests += f", {state.recovered:,} closed by recovery after a crash"
    lines = [requests]
    if state.drift:
        more = "more" if state.drift > 0 else "less"
        lines.append(
            f"charged    ${decimal_str(abs(state.drift))} {more} than estimated from usage and "
            f"listed prices (${decimal_str(state.estimated)} estimated)"
        )
    if state.overrun:
        lines.append(
            f"overrun    ${decimal_str(state.overrun)}: answers that cost more than they had "
            "reserved (the only way spending passes the limit)"
        )
    return lines


def _disputed(target: str) -> list[str]:
    """The ``disputed`` entries of the job journal beside a SQLite ledger, as lines.

    Read only (a running job may hold the journal); a line that does not parse is
    skipped: this is a report, the journal's own reader judges damage.
    """
    if target.startswith(REDIS_URL_SCHEMES):
        return []
    try:
        data = JobLayout(Path(target).parent).journal.read_bytes()
    except OSError:
        return []
    lines = []
    for raw in data.splitlines():
        if b'"disputed"' not in raw:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("op") == "disputed":
            lines.append(disputed_line(entry))
    return lines


def _topup(args: argparse.Namespace) -> int:
    async def change() -> LedgerState:
        async with _open(args) as ledger:
            before = await ledger.snapshot()
            limit = before.limit + args.add if args.limit is None else args.limit
            if limit > LEDGER_MAX_USD:
                raise UsageError(
                    f"a limit of {format_usd(limit)} is above the largest amount a ledger "
                    f"holds exactly (${LEDGER_MAX_USD:,}); nothing changed"
                )
            if limit < before.spent:
                # Never what anyone means: every request would be refused, and the
                # figure reads as a budget while the money is already gone.
                raise UsageError(
                    f"--limit {format_usd(limit)} is below the {format_usd(before.spent)} "
                    f"already spent from this ledger: nothing more could be spent. Give a "
                    f"limit of at least {format_usd(before.spent)} (e.g. --limit "
                    f"{decimal_str(before.spent + before.reserved)} stops new requests), "
                    "or --add USD"
                )
            await ledger.set_limit(limit)
            return await ledger.snapshot()

    state = asyncio.run(change())
    print(f"limit ${decimal_str(state.limit)}, available ${decimal_str(state.available)}")
    return 0


def _state_dict(state: LedgerState) -> dict[str, Any]:
    names = ("limit", "spent", "reserved", "estimated", "drift", "overrun")
    out: dict[str, Any] = {name: decimal_str(getattr(state, name)) for name in names}
    out["available"] = decimal_str(state.available)
    out.update(open=state.open, settled=state.settled, released=state.released)
    out["recovered"] = state.recovered
    return out


def _res_dict(res: Reservation) -> dict[str, Any]:
    return {
        "id": res.id,
        "key": res.key,
        "amount": decimal_str(res.amount),
        "generation_id": res.generation_id,
        "owner": res.owner,
    }
