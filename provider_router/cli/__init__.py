"""The ``provider-router`` command line.

``main(argv) -> int`` is pure (tests call it); ``run()`` is the console entry
point. Each sub-command lives in its own module under ``provider_router.cli``
and exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(args) -> int``. This package is the only place that
configures logging.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from provider_router import __version__
from provider_router._exceptions import JobRefused, ProviderRouterError
from provider_router.cli._errors import UsageError, describe_failure
from provider_router.cli._logging import configure_logging, report_events
from provider_router.cli._parser import HelpFormatter, Parser, finish_parsers

# One module per sub-command, in the order `--help` lists them.
_COMMAND_MODULES: tuple[str, ...] = (
    "endpoints",
    "preflight",
    "verify",
    "simulate",
    "project",
    "run",
    "export",
    "demo",
    "merge",
    "ledger",
    "observe",
)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="provider-router",
        description="Cost-aware, policy-routed, budget-capped inference through OpenRouter.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity on stderr: warning and error print one line per kind of event "
        "with its count at the end; info and debug print every event as it happens",
    )
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "console", "json"],
        help="console for people (in colour on a terminal), json for machines; auto is console",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"provider_router.cli.{name}")
        module.register(subparsers)
    finish_parsers(parser)
    return parser


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    ``own_process``: this process runs the command and nothing else (the console
    script), so a long run may set the process's garbage collector for its load
    (:func:`provider_router._collector.tune_for_process`); a program that calls
    ``main`` keeps its collector as it is.
    """
    try:
        # A Ctrl-C while the command modules import (most of start-up) is one line.
        parser = build_parser()
    except KeyboardInterrupt:
        _error("interrupted", prefix="")
        return EXIT_INTERRUPTED
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command as given, for the hints that repeat it
    args.own_process = own_process
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        configure_logging(level=args.log_level, fmt=args.log_format)
        code: int = handler(args)
        # Flushed here, where a reader that left (`| head`) is still ours to handle.
        sys.stdout.flush()
    except (UsageError, JobRefused) as exc:
        # A mistake in what we were asked to do, caught before anything was sent.
        _error(str(exc))
        return EXIT_USAGE
    except ProviderRouterError as exc:
        # Our errors already say what went wrong and where; no traceback needed.
        _error(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted", prefix="")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `provider-router ... | head`: the reader left; that is not our error.
        _silence_stdout()
        return EXIT_OK
    except Exception as exc:
        # Foreign failures we can name (a Redis that is down, a directory we cannot
        # write) get one line; anything else is a bug and keeps its traceback.
        described = describe_failure(exc)
        if described is None:
            raise
        message, code = described
        _error(message)
        return code
    finally:
        with contextlib.suppress(BrokenPipeError):  # stderr closed as well
            report_events()
    return code


def _error(message: str, *, prefix: str = "error: ") -> None:
    print(f"provider-router: {prefix}{message}", file=sys.stderr)


def _silence_stdout() -> None:
    """Point stdout at devnull so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a descriptor
        pass


def run() -> None:
    """Console-script entry point (``provider-router``, ``python -m provider_router``)."""
    try:
        code = main(own_process=True)
    except KeyboardInterrupt:  # between the handlers above (a report, a flush): one line
        _error("interrupted", prefix="")
        code = EXIT_INTERRUPTED
    sys.exit(code)
