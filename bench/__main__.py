"""Run benchmarks: ``python -m bench`` (all) or ``python -m bench NAME [args...]``.

Each benchmark is a module ``bench/bench_<name>.py`` with ``main(argv) -> int``.
Results go to docs/performance.md by hand, with the command and the machine.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def _names() -> list[str]:
    here = Path(__file__).parent
    return sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    names = _names()
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: python -m bench [{'|'.join(names)}] [args...]")
        return 0
    selected = [argv[0]] if argv else names
    rest = argv[1:]
    for name in selected:
        if name not in names:
            print(f"unknown benchmark {name!r}; known: {', '.join(names)}", file=sys.stderr)
            return 2
        module = importlib.import_module(f"bench.bench_{name}")
        code = module.main(rest)
        if code:
            return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
