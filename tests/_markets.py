"""The default market with some endpoints secretly degraded (``serves:``), as a file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml


def degraded_market(directory: Path, serves: dict[str, dict[str, float]]) -> Path:
    """``directory/market.yaml``: the default market, ``serves`` set on the slugs named."""
    text = (resources.files("provider_router.testing") / "markets" / "kimi-k2.5.yaml").read_text()
    data = yaml.safe_load(text)
    for model in data["models"]:
        for endpoint in model["endpoints"]:
            if endpoint["slug"] in serves and model["id"] == "moonshotai/kimi-k2.5":
                endpoint["serves"] = serves[endpoint["slug"]]
    path = directory / "market.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
