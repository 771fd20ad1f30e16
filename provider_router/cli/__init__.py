"""The ``provider-router`` command line.

``main(argv) -> int`` is pure (tests call it); ``run()`` is the console entry
point. Each sub-command lives in its own module under ``provider_router.cli``
and exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(args) -> int``. This package is the only place that
configures logging.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from provider_router._exceptions import ProviderRouterError
from provider_router.cli._logging import configure_logging

# One module per sub-command, in the order `--help` lists them.
_COMMAND_MODULES: tuple[str, ...] = (
    "endpoints",
    "simulate",
    "project",
    "run",
    "export",
    "demo",
    "merge",
    "ledger",
)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provider-router",
        description="Cost-aware, policy-routed, budget-capped inference through OpenRouter.",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (logs go to stderr; default: warning)",
    )
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "console", "json"],
        help="console for people, json for machines; auto picks console on a terminal",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"provider_router.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    configure_logging(level=args.log_level, fmt=args.log_format)
    try:
        code: int = handler(args)
    except ProviderRouterError as exc:
        # Our errors already say what went wrong and where; no traceback needed.
        print(f"provider-router: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("provider-router: interrupted", file=sys.stderr)
        return 130
    return code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
