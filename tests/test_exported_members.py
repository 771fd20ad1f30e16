"""The public API is flat, explicit and sorted (as httpx checks its own)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import provider_router


def test_all_is_sorted() -> None:
    assert provider_router.__all__ == sorted(provider_router.__all__)


def test_all_is_complete() -> None:
    public = {name for name in dir(provider_router) if not name.startswith("_")}
    public -= {"annotations"}
    # Sub-packages and modules are reachable as attributes once imported; they are
    # not part of the flat API.
    modules = {name for name in public if type(getattr(provider_router, name)).__name__ == "module"}
    assert public - modules == set(provider_router.__all__) - {"__version__"}


def test_every_name_resolves() -> None:
    for name in provider_router.__all__:
        assert getattr(provider_router, name) is not None


def test_lazy_names_match_the_typed_imports() -> None:
    # The TYPE_CHECKING imports (what type checkers and readers see) and the lazy
    # table (what runs) must name the same objects from the same modules.
    tree = ast.parse(Path(provider_router.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                assert stmt.module is not None
                typed.update({alias.name: stmt.module for alias in stmt.names})
    assert typed == provider_router._LAZY


_HEAVY = ("aiohttp", "pydantic", "rich", "yaml", "sqlite3", "structlog", "redis")
_PROBE = """
import sys
{statement}
heavy = {heavy!r}
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy
             or m.startswith(("provider_router.jobs", "provider_router.planning.projection",
                              "provider_router.testing", "provider_router.cli."))))
"""


def _loaded_after(statement: str) -> list[str]:
    code = _PROBE.format(statement=statement, heavy=_HEAVY)
    done = subprocess.run(  # noqa: S603 - our own fixed script
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = ast.literal_eval(done.stdout)
    return loaded


def test_import_loads_nothing_heavy() -> None:
    # Import time is measured by bench/ (docs/performance.md); this guards its cause.
    assert _loaded_after("import provider_router") == []


def test_a_plain_router_loads_no_batch_projection_rich_or_yaml() -> None:
    loaded = _loaded_after("from provider_router import MemoryLedger, ProviderPolicy, Router")
    # aiohttp and pydantic are what a Router is made of; sqlite3 (a ~2 ms C module)
    # comes with the ledger package the client types against.
    assert [m for m in loaded if not m.startswith(("aiohttp", "pydantic", "sqlite3"))] == []
