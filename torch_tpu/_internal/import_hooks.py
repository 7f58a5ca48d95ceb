"""Runs a function right after a module is imported (or at once if it
already is): how torch_tpu registers with torch._dynamo and Inductor
without importing them (seconds) on ``import torch_tpu``."""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable

_hooks: dict[str, list[Callable[[Any], None]]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        for fn in _hooks.pop(self._name, []):
            fn(module)

    def __getattr__(self, item: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, item)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_finder = _Finder()


def after_import(name: str, fn: Callable[[Any], None]) -> None:
    """Calls fn(module) once module `name` has been imported."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    _hooks.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
