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
        for module in _package_imports(path):
            parts = module.split(".")
            if len(parts) > 1 and parts[1] != "testing":
                assert parts[1] not in client_side, f"{path.name} imports {module}"
                assert parts[1] in NEUTRAL, module


# Modules both sides may use: they import nothing but each other.
NEUTRAL = {
    "_collector",
    "_json",
    "_money",
    "_format",
    "_constants",
    "_types",
    "_exceptions",
    "_resource",
    "_secrets",
    "_spend_limits",  # a pure reading of an error body; imports nothing
}


def _package_imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
    return [m for m in modules if m.split(".")[0] == "provider_router"]


def test_the_neutral_modules_import_only_each_other() -> None:
    package = Path(provider_router.__file__).parent
    for name in NEUTRAL:
        for module in _package_imports(package / f"{name}.py"):
            assert module.split(".")[1] in NEUTRAL, f"{name}.py imports {module}"


def test_the_simulator_is_not_re_exported_from_the_top_package() -> None:
    assert "SimulatorServer" not in provider_router.__all__
