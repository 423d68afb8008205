"""``import tvm.relay`` runs every framework frontend and every BYOC pattern table: defer them.

Close to half of importing Relay is ``tvm.relay.frontend`` (hhb's TFLite frontend alone pulls in
its quantizer and scipy) and ``tvm.relay.op.contrib`` (pattern tables of external codegens),
which ``relay-tasks extract`` pays on every run although extraction reads neither. Importing
Relay through :func:`defer_frontends` creates both packages as usual (name, path, spec) but runs
a package's ``__init__`` only when something reads a name it would define:
``relay.frontend.from_onnx`` and ``from tvm.relay.frontend import from_onnx`` run it then.
Importing a submodule (``tvm.testing`` imports ``tvm.relay.op.contrib.ethosn``) runs just that
submodule, once, as it would have anyway; the ``__init__`` later finds it imported.

What those modules register when they run (``relay.ext.*`` functions, ``target.<codegen>`` op
attributes, pattern tables) serves partitioning for external codegens, which asks for them
first; tests/test_deferred.py checks that the tasks do not change when they run first.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

DEFERRED = ("tvm.relay.frontend", "tvm.relay.op.contrib")


class _RunOnFirstRead(importlib.abc.Loader):
    """Leaves the package's code unrun behind a module ``__getattr__`` (PEP 562).

    Not importlib's ``LazyLoader``: its module runs on any attribute read, ``__path__``
    included, so importing a submodule would run the package, which imports that submodule,
    and the import would then run the submodule a second time (registering its op attributes
    twice is an error).
    """

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        def run_then_read(name: str) -> Any:
            # A submodule read as a name (``from . import qnn_torch`` inside the PyTorch
            # frontend) is imported alone, so that one frontend can be imported without the
            # others (hhb's TFLite frontend and its quantizer: a second of a PyTorch load).
            submodule = f"{module.__name__}.{name}"
            if not name.startswith("_") and importlib.util.find_spec(submodule) is not None:
                return importlib.import_module(submodule)
            del module.__dict__["__getattr__"]
            self._loader.exec_module(module)
            return getattr(module, name)

        module.__dict__["__getattr__"] = run_then_read


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds the deferred packages where Python would and hands them a loader that waits."""

    def __init__(self, packages: Sequence[str] = DEFERRED) -> None:
        self.packages = frozenset(packages)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.packages:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RunOnFirstRead(spec.loader)
        return spec


def import_alone(name: str) -> ModuleType:
    """Import the module ``name`` without running its package's ``__init__``, if the package
    was not imported yet (it then waits as the deferred ones do): ``tvm.relay.testing``'s
    imports ``tvm.testing`` and with it pytest, a third of a second of ``relay-tasks extract``
    that building its ResNet-50 never needs."""
    package = name.rpartition(".")[0]
    if package not in sys.modules:
        finder = _DeferringFinder([package])
        sys.meta_path.insert(0, finder)
        try:
            importlib.import_module(package)
        finally:
            sys.meta_path.remove(finder)
    return importlib.import_module(name)


def defer_frontends() -> None:
    """Import ``tvm.relay`` with :data:`DEFERRED` loaded on first use.

    Does nothing when Relay is already imported (the caller imported it first, eagerly).
    """
    if "tvm.relay" in sys.modules:
        return
    finder = _DeferringFinder()
    sys.meta_path.insert(0, finder)
    try:
        import tvm.relay  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


defer_frontends()
