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
_ABOVE_BATCH = ("provider_router.jobs", "provider_router.cli", "provider_router.ray")


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
    assert "provider_router.ledger" in graph["provider_router.client.router"] or any(
        t.startswith("provider_router.ledger") for t in graph["provider_router.client.router"]
    )
    assert "provider_router.planning.plan" in graph["provider_router.planning.projection"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_nothing_below_batch_imports_from_it() -> None:
    below = {
        name: sorted(t for t in targets if t.startswith("provider_router.jobs"))
        for name, targets in _graph().items()
        if not name.startswith(_ABOVE_BATCH)
    }
    assert {name: t for name, t in below.items() if t} == {}


# The stages of the flow, bottom to top: each folder imports only the foundation
# (the package's top-level private modules) and the folders before it. planning and
# checks are siblings; testing (the local OpenRouter) stands on the foundation alone.
STAGES = (
    "_http",
    "catalog",
    "routing",
    "ledger",
    "client",
    "planning|checks",
    "jobs",
    "ray",
    "cli",
)
# Inside jobs/: the job directory is the floor, the Batch API route stands on it, the
# runner on both, what an operator sees on top of all three, and run_plan (jobs/run.py,
# and the package's lazy re-exports) on top of everything: it wires the runner to its
# observers, as `provider-router run` does.
JOB_STAGES = ("store", "batch_api", "", "observe", "run")
_JOBS_TOP = ("provider_router.jobs", "provider_router.jobs.run")


def _stage(module: str) -> int | None:
    """The stage index of a module (None: the foundation or the package itself)."""
    parts = module.split(".")
    if len(parts) < 3 and not (len(parts) == 2 and f"{module}" in _FOLDERS):
        return None
    top = parts[1]
    for index, names in enumerate(STAGES):
        if top in names.split("|"):
            return index
    return None


_FOLDERS = {f"provider_router.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def _job_stage(module: str) -> int:
    if module in _JOBS_TOP:
        return JOB_STAGES.index("run")
    parts = module.split(".")
    inner = parts[2] if len(parts) > 3 and parts[2] in JOB_STAGES else ""
    return JOB_STAGES.index(inner)


def _upward_edges() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for name, targets in _graph().items():
        if name == "provider_router.__main__":
            continue  # `python -m provider_router` is the command line itself
        top = name.split(".")[1]
        for target in targets:
            target_top = target.split(".")[1]
            if top == "testing" or target_top == "testing":
                # The simulator stands on the foundation; only the CLI (demo,
                # simulate) runs it.
                if top == "testing" and target_top != "testing" and _stage(target) is not None:
                    found.add((name, target))
                if target_top == "testing" and top not in ("testing", "cli"):
                    found.add((name, target))
                continue
            if top == target_top == "jobs":
                if _job_stage(target) > _job_stage(name):
                    found.add((name, target))
                continue
            mine, theirs = _stage(name), _stage(target)
            if theirs is None:
                continue
            if mine is None or theirs > mine or (theirs == mine and top != target_top):
                found.add((name, target))
    return found


def test_imports_point_down_the_flow() -> None:
    assert _upward_edges() == set()


def test_the_stage_check_sees_an_upward_import() -> None:
    assert _stage("provider_router.client.router") == STAGES.index("client")
    assert _stage("provider_router._money") is None
    assert _stage("provider_router.planning.plan") == _stage("provider_router.checks.verify")
    assert _job_stage("provider_router.jobs.store.journal") < _job_stage(
        "provider_router.jobs.runner"
    )
    assert _job_stage("provider_router.jobs.observe.live") < _job_stage("provider_router.jobs.run")
    assert _job_stage("provider_router.jobs.runner") < _job_stage(
        "provider_router.jobs.observe.live"
    )


def test_no_folder_holds_more_than_25_modules() -> None:
    sizes = {
        str(folder.relative_to(PACKAGE.parent)): len(list(folder.glob("*.py")))
        for folder in [PACKAGE, *PACKAGE.rglob("*")]
        if folder.is_dir() and (folder / "__init__.py").is_file()
    }
    assert {folder: n for folder, n in sizes.items() if n > 25} == {}


def test_no_module_repeats_its_folders_name() -> None:
    repeated = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.stem.lstrip("_").startswith(path.parent.name.lstrip("_"))
    ]
    assert repeated == []
