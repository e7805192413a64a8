"""The model families, one module each: importing this package registers every one of them
(`steps.models.config.register`). A new family is a new module here; nothing else names it."""

from __future__ import annotations

import importlib
import pkgutil

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
