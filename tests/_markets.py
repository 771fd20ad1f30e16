"""The default market, edited for a test, as a file the local OpenRouter reads."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

Edit = Callable[[dict[str, Any]], None]
"""Changes one endpoint of Kimi K2.5 (its market-file mapping) in place."""


def edited_market(directory: Path, edit: Edit) -> Path:
    """``directory/market.yaml``: the default market with ``edit`` applied to every
    endpoint of ``moonshotai/kimi-k2.5``."""
    text = (resources.files("provider_router.testing") / "markets" / "kimi-k2.5.yaml").read_text()
    data = yaml.safe_load(text)
    for model in data["models"]:
        if model["id"] == "moonshotai/kimi-k2.5":
            for endpoint in model["endpoints"]:
                edit(endpoint)
    path = directory / "market.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def degraded_market(directory: Path, serves: dict[str, dict[str, float]]) -> Path:
    """The default market, ``serves`` set on the endpoints whose slugs it names."""

    def degrade(endpoint: dict[str, Any]) -> None:
        if endpoint["slug"] in serves:
            endpoint["serves"] = serves[endpoint["slug"]]

    return edited_market(directory, degrade)
