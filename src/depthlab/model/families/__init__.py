"""The model-family registry: one module per family in this package, each declaring everything depthlab knows
about its family on one Family subclass registered by name (depthlab.model.families.base lists what that is; the
families side by side: docs/method.md section 2.4).

Every module of this package is imported with it, so adding a family is adding one file here. The presets
(`--preset`) are the families' own, gathered here.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from depthlab import UserError
from depthlab.config import Config
from depthlab.model.families.base import FAMILIES, Family, family_of, register, require

for _module in pkgutil.iter_modules(__path__):  # sorted by name
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

PRESETS = {name: functools.partial(make, name) for family in FAMILIES.values() for name, make in family.presets.items()}


def preset(name: str) -> Config:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]()


__all__ = ["FAMILIES", "PRESETS", "Family", "family_of", "preset", "register", "require"]
