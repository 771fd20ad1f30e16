"""The job's manifest: what the job is, in ``DIR/job.json``.

A job directory's outputs answer one model, under one provider policy, each dataset
with its own route, generation parameters and input files. The manifest records them
(format in docs/output.md, "What the job is: job.json"), written atomically (a
temporary file beside it, fsynced, renamed, the directory fsynced) and read on every
resume, which is refused if it would change what the outputs answer
(:mod:`provider_router.jobs.identity`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import DataFileError
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.aside import sync_directory

__all__ = ["MANIFEST_VERSION", "DatasetManifest", "JobManifest", "read_manifest", "write_manifest"]

MANIFEST_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class DatasetManifest:
    """One dataset of the job.

    Attributes:
        route: ``sync``, ``batch`` or ``auto`` (as the plan says).
        generation: the generation fields every request of it is sent with
            (``max_tokens`` included; a prompt line's own ``tools`` aside).
        inputs: its prompt files (absolute paths).
    """

    route: str
    generation: Mapping[str, Any]
    inputs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "generation": dict(self.generation),
            "inputs": list(self.inputs),
        }


@dataclass(frozen=True, slots=True)
class JobManifest:
    """What a job is: its model, provider policy and datasets."""

    model: str
    policy: Mapping[str, Any]
    datasets: Mapping[str, DatasetManifest] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": MANIFEST_VERSION,
            "model": self.model,
            "policy": dict(self.policy),
            "datasets": {name: d.to_json() for name, d in sorted(self.datasets.items())},
        }

    @classmethod
    def from_json(cls, data: Any) -> JobManifest:
        """Raises: ValueError, KeyError, TypeError: not a manifest."""
        if not isinstance(data, dict) or data.get("v") != MANIFEST_VERSION:
            raise ValueError(f"not a version {MANIFEST_VERSION} manifest")
        datasets = {}
        for name, entry in dict(data["datasets"]).items():
            datasets[str(name)] = DatasetManifest(
                route=str(entry["route"]),
                generation=dict(entry["generation"]),
                inputs=tuple(str(p) for p in entry["inputs"]),
            )
        return cls(model=str(data["model"]), policy=dict(data["policy"]), datasets=datasets)


def read_manifest(directory: Path) -> JobManifest | None:
    """The job's manifest (None: the directory has none yet).

    Raises:
        DataFileError: it exists but cannot be read as one (names the file).
    """
    path = JobLayout(directory).manifest
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(path, f"cannot read the job's manifest: {exc}") from None
    try:
        return JobManifest.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise DataFileError(
            path,
            f"not a job manifest ({exc}); restore it from a backup, or move it away to "
            "have the next run write it from its own model, policy and parameters",
        ) from None


def write_manifest(directory: Path, manifest: JobManifest) -> None:
    """Write ``DIR/job.json`` atomically (unchanged when it already says the same)."""
    path = JobLayout(directory).manifest
    data = json.dumps(manifest.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        if path.read_text(encoding="utf-8") == data:
            return
    except (OSError, UnicodeDecodeError):
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    sync_directory(directory)
