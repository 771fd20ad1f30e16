"""``job_keys.json``: the keys ``--job-key`` made for a job's runs, by hash, never a key.

Each run with a job key makes a new OpenRouter key (the plaintext is shown only when it
is made, so a resume cannot use the last one) and disables it when it ends. The record
keeps each key's ``hash`` (its id in the management API), name, limit, expiry and
whether it was disabled, so a run killed before it could disable its key has it
disabled by the next run. Written atomically (a temporary file beside it, then a
rename): a crash leaves the old record or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from provider_router._exceptions import DataFileError

__all__ = ["KeyRecord", "KeyRecords"]


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One key made for a run of the job (no secret: the hash is an id, not the key).

    Attributes:
        hash: the key's id in the management API (``/keys/{hash}``).
        name: the name it was made with.
        limit_usd: its credit limit, as an exact decimal string.
        expires_at: when OpenRouter stops accepting it (ISO 8601, UTC).
        created_at: when it was made (ISO 8601, UTC).
        disabled_at: when this job disabled it (None: not yet, e.g. a killed run).
    """

    hash: str
    name: str
    limit_usd: str
    expires_at: str
    created_at: str
    disabled_at: str | None = None


class KeyRecords:
    """The job's ``job_keys.json`` (made on the first write)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __iter__(self) -> Iterator[KeyRecord]:
        return iter(self.read())

    def read(self) -> list[KeyRecord]:
        """Every key made for the job, oldest first (none when the file is missing).

        Raises:
            DataFileError: the file is not a record this module wrote.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        try:
            document = json.loads(text)
            return [KeyRecord(**entry) for entry in document["keys"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataFileError(
                self.path, f"not a record of job keys ({exc}); move it away to start a new one"
            ) from None

    def pending(self) -> list[KeyRecord]:
        """Keys made and not yet disabled (a run that did not end cleanly left them)."""
        return [record for record in self.read() if record.disabled_at is None]

    def add(self, record: KeyRecord) -> None:
        """Record a key just made (before it is used)."""
        self._write([*self.read(), record])

    def disabled(self, key_hash: str, when: str) -> None:
        """Record that the key ``key_hash`` was disabled at ``when``."""
        records = [
            replace(r, disabled_at=when) if r.hash == key_hash and r.disabled_at is None else r
            for r in self.read()
        ]
        self._write(records)

    def _write(self, records: list[KeyRecord]) -> None:
        document: dict[str, Any] = {"keys": [asdict(r) for r in records]}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
