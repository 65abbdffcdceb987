"""Lazy package attributes (PEP 562): the one mechanism behind ``gapdyn.<name>`` and ``llm_probe.<name>``.

A package lists, per submodule, the public names that submodule defines, and calls :func:`export_lazily` from its
``__init__``. ``import <package>`` then imports no submodule; the first access to ``<package>.<name>`` imports the
one module that defines it and caches the value in the package namespace; any other submodule resolves on access.
Standard library only, so importing a package costs nothing beyond its own ``__init__``.
"""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["export_lazily"]


class _LazyPackage(types.ModuleType):
    """A package's module type: an exported function named as its own module (``llm_probe.warmup``) stays the
    package attribute when the import system binds that submodule to the package, as with eager imports."""

    def __setattr__(self, name, value):
        table = self.__dict__.get("_EXPORTS", {})
        if (isinstance(value, types.ModuleType) and table.get(name) == name
                and value.__name__ == f"{self.__name__}.{name}" and hasattr(value, name)):
            value = getattr(value, name)
        super().__setattr__(name, value)


def export_lazily(package: str, exports_by_module: dict[str, tuple[str, ...]], *,
                  submodules: tuple[str, ...] = ()) -> dict[str, str]:
    """Install ``__getattr__`` and ``__dir__`` on the package ``package`` (its ``__name__``) so that each name of
    ``exports_by_module`` (submodule -> the names it defines) loads its module on first access; ``submodules`` are
    listed by ``dir()`` too. Returns name -> submodule (the package keeps it as ``_EXPORTS``). A name that is
    neither exported nor a submodule is an AttributeError naming the package."""
    table = {name: module for module, names in exports_by_module.items() for name in names}
    if len(table) != sum(len(names) for names in exports_by_module.values()):
        raise ValueError(f"{package}: a name is exported by two modules")
    mod = sys.modules[package]

    def __getattr__(name: str):
        module = table.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f"{package}.{module}"), name)
        elif not name.startswith("__"):
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        mod.__dict__[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(mod.__dict__) | set(mod.__dict__.get("__all__", ())) | set(submodules))

    mod.__dict__["__getattr__"] = __getattr__
    mod.__dict__["__dir__"] = __dir__
    mod.__class__ = _LazyPackage
    return table
