"""`provider_router.jobs` is a public namespace: explicit, sorted, complete, lazy and cheap
(as tests/test_exported_members.py checks the package's top level)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import provider_router.jobs as jobs


def test_all_is_sorted_and_complete() -> None:
    assert jobs.__all__ == sorted(jobs.__all__)
    public = {name for name in dir(jobs) if not name.startswith("_")} - {"annotations"}
    modules = {name for name in public if type(getattr(jobs, name)).__name__ == "module"}
    assert public - modules == set(jobs.__all__)


def test_every_name_resolves() -> None:
    for name in jobs.__all__:
        assert getattr(jobs, name) is not None


def test_lazy_names_match_the_typed_imports() -> None:
    tree = ast.parse(Path(jobs.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                assert stmt.module is not None
                typed.update({alias.name: stmt.module for alias in stmt.names})
    assert typed == jobs._LAZY


def test_importing_the_namespace_loads_none_of_it() -> None:
    code = (
        "import sys, provider_router.jobs\n"
        "print(sorted(m for m in sys.modules if m.startswith('provider_router.jobs.')"
        " or m.split('.')[0] in ('aiohttp', 'pydantic', 'rich', 'yaml', 'redis')))"
    )
    done = subprocess.run(  # noqa: S603 - our own fixed script
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert ast.literal_eval(done.stdout) == []
