"""The name to install is ours: every install line names it, and it is what is installed.

``provider-router`` on the package index is another project, which also installs a
``provider_router`` package; a user who copies ``pip install 'provider-router[ray]'``
gets theirs and a warning that the extra does not exist. The import name and the
command stay ``provider_router`` and ``provider-router``.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import provider_router
from provider_router._constants import DISTRIBUTION

ROOT = Path(__file__).parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# `pip install NAME`, `pip install 'NAME[extra,...]'`, `pip install -e '.[...]'`...
PIP_INSTALL = re.compile(r"pip install (?:--?\S+ )*'?(?P<name>[\w.\-]+)(?:\[(?P<extras>[^\]]*)\])?")
# What a user copies: the README, docs/, the package's messages and docstrings, examples.
TEXTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "provider_router").rglob("*.py")),
    *sorted((ROOT / "examples").glob("*.ipynb")),
]


def _install_lines() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in TEXTS:
        if "history" in path.parts:  # what was true then, as it was written
            continue
        for match in PIP_INSTALL.finditer(path.read_text(encoding="utf-8")):
            extras = [e.strip() for e in (match["extras"] or "").split(",") if e.strip()]
            found.append((path.relative_to(ROOT).as_posix(), match["name"], extras))
    return found


def test_the_distribution_is_ours_and_not_the_import_name() -> None:
    assert PYPROJECT["name"] == DISTRIBUTION == "provider-router-openrouter"
    assert PYPROJECT["scripts"] == {"provider-router": "provider_router.cli:run"}


def test_every_install_line_names_our_distribution_and_extras_it_has() -> None:
    extras = set(PYPROJECT["optional-dependencies"])
    lines = _install_lines()
    ours = [(where, name, wanted) for where, name, wanted in lines if "provider" in name]
    assert {where for where, _, _ in ours} >= {"README.md", "docs/workers.md"}
    for where, name, wanted in ours:
        assert name == DISTRIBUTION, f"{where}: pip install {name}"
        assert set(wanted) <= extras, f"{where}: {name}[{','.join(wanted)}]"
    readme = (ROOT / "README.md").read_text()
    assert f"pip install '{DISTRIBUTION}[ray,redis]'" in readme


def test_the_installed_distribution_is_this_package() -> None:
    """What ``make`` installed answers to the new name, with the extras the README names."""
    assert importlib.metadata.version(DISTRIBUTION) == provider_router.__version__
    meta = importlib.metadata.metadata(DISTRIBUTION)
    assert {"ray", "redis", "metrics"} <= set(meta.get_all("Provides-Extra") or [])
    scripts = importlib.metadata.distribution(DISTRIBUTION).entry_points
    assert [(e.name, e.value) for e in scripts if e.group == "console_scripts"] == [
        ("provider-router", "provider_router.cli:run")
    ]
