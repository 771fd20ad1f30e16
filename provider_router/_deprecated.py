"""Old names that moved or were renamed: they still resolve, for one release, with a warning.

A module's ``__getattr__`` hands its old names here. Each use warns
(``DeprecationWarning``, at the user's own line) and returns the object at its new
home; the old names stay out of ``__all__`` and ``dir()``, so nothing new finds them.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Final

REMOVED_IN: Final = "0.3.0"
"""The release in which the old names stop resolving."""


def resolve_old_name(old: str, new: str) -> Any:
    """The object at ``new`` (``"package.module.Name"``), warning that ``old`` goes away.

    Call it straight from a module's ``__getattr__``: the warning then points at the
    line that used the old name.
    """
    module, _, name = new.rpartition(".")
    moved = "moved to" if old.rpartition(".")[2] == name else "is renamed"
    warnings.warn(
        f"{old} {moved} {new}; the old name is removed in {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,  # past this function and the caller's __getattr__
    )
    return getattr(importlib.import_module(module), name)
