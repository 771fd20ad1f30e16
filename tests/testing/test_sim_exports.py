"""``provider_router.testing`` is its own public namespace, with a complete, sorted __all__."""

from __future__ import annotations

import ast
from pathlib import Path

import provider_router
import provider_router.testing as testing


def test_all_is_sorted_and_every_name_exists() -> None:
    assert testing.__all__ == sorted(testing.__all__)
    for name in testing.__all__:
        assert hasattr(testing, name), name


def test_all_lists_every_public_import() -> None:
    tree = ast.parse(Path(testing.__file__).read_text())
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("provider_router.")
        for alias in node.names
    }
    assert imported == set(testing.__all__)


def test_the_simulator_imports_nothing_from_the_client_side() -> None:
    client_side = {
        "records",
        "catalog",
        "policy",
        "ranking",
        "client",
        "ledger",
        "batch",
        "_http",
        "routing",
        "retry",
        "limiter",
        "projection",
        "workload",
        "sse",
        "health",
        "results",
        "quantization",
        "_completion",
    }
    package = Path(testing.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.append(node.module)
            elif isinstance(node, ast.Import):
                modules.extend(alias.name for alias in node.names)
            for module in modules:
                parts = module.split(".")
                if parts[0] == "provider_router" and len(parts) > 1 and parts[1] != "testing":
                    assert parts[1] not in client_side, f"{path.name} imports {module}"
                    assert parts[1] in {"_money", "_constants", "_types", "_exceptions"}, module


def test_the_simulator_is_not_re_exported_from_the_top_package() -> None:
    assert "SimulatorServer" not in provider_router.__all__
