"""The package's import graph: no cycles, and nothing below ``batch/`` imports from it.

Every import counts, those under ``TYPE_CHECKING`` and inside functions included: a
cycle hidden in a function is still two modules that cannot be understood apart.
The package's ``__init__`` (a lazy re-export hub) is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import provider_router

PACKAGE = Path(provider_router.__file__).parent
# Layers above the batch runner, allowed to import it (ray: its summary and records).
_ABOVE_BATCH = ("provider_router.batch", "provider_router.cli", "provider_router.ray")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                if candidate in modules:
                    targets.add(candidate)
                elif module in modules:
                    targets.add(module)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name in modules)
    targets.discard("provider_router")
    targets.discard(name)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: _imports(name, path, modules)
        for name, path in modules.items()
        if name != "provider_router"
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_real_imports() -> None:
    graph = _graph()
    assert "provider_router.ledger" in graph["provider_router.client"] or any(
        t.startswith("provider_router.ledger") for t in graph["provider_router.client"]
    )
    assert "provider_router.plan" in graph["provider_router.projection"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_nothing_below_batch_imports_from_it() -> None:
    below = {
        name: sorted(t for t in targets if t.startswith("provider_router.batch"))
        for name, targets in _graph().items()
        if not name.startswith(_ABOVE_BATCH)
    }
    assert {name: t for name, t in below.items() if t} == {}
