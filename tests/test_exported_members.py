"""The public API: a small top level and one namespace per secondary feature.

Each has an explicit, sorted, complete ``__all__`` (as httpx checks its own), loads
lazily, and the names that left the top level still resolve there for one release,
with a warning.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import provider_router

NAMESPACES = (
    "provider_router",
    "provider_router.jobs",
    "provider_router.planning",
    "provider_router.testing",
    "provider_router.ray",  # needs no Ray to import: RayJob.generate imports it
)
LAZY = ("provider_router", "provider_router.jobs", "provider_router.planning")

# The names that left the top level, and where they went.
MOVED_TO_JOBS = [
    "DatasetMerge",
    "DatasetProgress",
    "DatasetTally",
    "ExportReport",
    "FileJournal",
    "JobRunner",
    "Journal",
    "LostRequest",
    "MergeReport",
    "OutputRecord",
    "RunProgress",
    "RunSummary",
    "StopReason",
    "export_conversations",
    "merge_outputs",
    "read_outputs",
]
MOVED_TO_PLANNING = [
    "BatchRoute",
    "BudgetFit",
    "CostRange",
    "DatasetDemand",
    "DatasetProjection",
    "DatasetSpec",
    "GenerationParams",
    "PartialDataset",
    "PilotResult",
    "Plan",
    "PrefixShare",
    "Projection",
    "Prompt",
    "PromptFileStats",
    "PromptReader",
    "RouteComparison",
    "RouteShare",
    "SampleStats",
    "Scenario",
    "TokenTotals",
    "WorkloadEstimate",
    "approx_prompt_tokens",
    "batch_route",
    "compare_routes",
    "demands_from_plan",
    "estimate_from_samples",
    "estimate_prompt_tokens",
    "flat_pricing",
    "load_plan",
    "measure_prompts",
    "project",
    "run_pilot",
    "sample_prompts",
    "shared_prefix_share",
]
OLD_NAMES = [
    *(("provider_router", name, f"provider_router.jobs.{name}") for name in MOVED_TO_JOBS),
    *(("provider_router", name, f"provider_router.planning.{name}") for name in MOVED_TO_PLANNING),
    ("provider_router", "BatchRunner", "provider_router.jobs.JobRunner"),
    ("provider_router.jobs", "BatchRunner", "provider_router.jobs.JobRunner"),
    ("provider_router.jobs.runner", "BatchRunner", "provider_router.jobs.JobRunner"),
]


def _resolve(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_all_is_sorted(namespace: str) -> None:
    names = importlib.import_module(namespace).__all__
    assert names == sorted(names)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_all_is_complete(namespace: str) -> None:
    module = importlib.import_module(namespace)
    public = {name for name in dir(module) if not name.startswith("_")}
    public -= {"annotations"}
    # Sub-packages and modules are reachable as attributes once imported; they are
    # not part of the API.
    modules = {name for name in public if isinstance(getattr(module, name), ModuleType)}
    assert public - modules == set(module.__all__) - {"__version__"}


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_every_name_resolves(namespace: str) -> None:
    module = importlib.import_module(namespace)
    for name in module.__all__:
        assert getattr(module, name) is not None


@pytest.mark.parametrize("namespace", LAZY)
def test_lazy_names_match_the_typed_imports(namespace: str) -> None:
    # The TYPE_CHECKING imports (what type checkers and readers see) and the lazy
    # table (what runs) must name the same objects from the same modules.
    module = importlib.import_module(namespace)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                assert stmt.module is not None
                typed.update({alias.name: stmt.module for alias in stmt.names})
    assert typed == module._LAZY


def test_the_top_level_is_what_a_request_needs() -> None:
    assert len(provider_router.__all__) <= 90


def test_each_name_has_one_home() -> None:
    top, jobs, planning = (set(importlib.import_module(n).__all__) for n in LAZY)
    assert top & jobs == top & planning == jobs & planning == set()


def test_every_moved_name_is_listed_in_its_new_home() -> None:
    for _, _, new in OLD_NAMES:
        module, _, name = new.rpartition(".")
        assert name in importlib.import_module(module).__all__, new
    assert set(provider_router._MOVED) == {"BatchRunner", *MOVED_TO_JOBS, *MOVED_TO_PLANNING}


@pytest.mark.parametrize(("module", "old", "new"), OLD_NAMES)
def test_an_old_name_warns_at_the_users_line_and_is_the_same_object(
    module: str, old: str, new: str
) -> None:
    namespace = importlib.import_module(module)
    expected = re.escape(f"{module}.{old}") + r" (moved to|is renamed) " + re.escape(new)
    with pytest.warns(
        DeprecationWarning, match=f"^{expected}; the old name is removed in 0.3.0$"
    ) as caught:
        value = getattr(namespace, old)
    assert value is _resolve(new)
    assert [w.filename for w in caught] == [__file__]
    # It is looked up again (and warns again) next time: never cached, never listed.
    assert old not in dir(namespace)
    assert old not in getattr(namespace, "__all__", ())
    assert old not in vars(namespace)


def test_from_import_of_an_old_name_warns_at_the_import_line() -> None:
    with pytest.warns(DeprecationWarning, match="provider_router.Plan moved to") as caught:
        from provider_router import Plan
    with pytest.warns(DeprecationWarning, match="jobs.runner.BatchRunner is renamed") as more:
        from provider_router.jobs.runner import BatchRunner
    from provider_router.jobs import JobRunner
    from provider_router.planning import Plan as NewPlan

    assert Plan is NewPlan
    assert BatchRunner is JobRunner
    assert {w.filename for w in [*caught, *more]} == {__file__}


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    for namespace in (*LAZY, "provider_router.jobs.runner"):
        with pytest.raises(AttributeError, match="NoSuchName"):
            _ = importlib.import_module(namespace).NoSuchName


_HEAVY = ("aiohttp", "pydantic", "rich", "yaml", "sqlite3", "structlog", "redis")
_PROBE = """
import sys
{statement}
heavy = {heavy!r}
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy
             or m.startswith(("provider_router.jobs", "provider_router.planning",
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


@pytest.mark.parametrize("namespace", ["provider_router.jobs", "provider_router.planning"])
def test_importing_a_namespace_loads_nothing_behind_it(namespace: str) -> None:
    assert _loaded_after(f"import {namespace}") == [namespace]
