"""One extraction request: the user's loose arguments, checked and converted once.

A public entry point turns ``(mod, target, params)`` and its tuner's PassContext settings into a
:class:`Request` as its first step; everything after it (the pipeline, the backend, the adapter's
conversion) reads the request and never the raw arguments, so no path converts the module or
parses the target twice (converting the module type-checks all of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import tvm
from tvm.ir import IRModule
from tvm.target import Target

from .inputs import ParamsLike, TargetLike, as_module, as_params, as_target
from .optimize.pipeline import PassSettings


@dataclass(frozen=True)
class Request:
    """A model to extract from, the target its tasks are for, its weights and the PassContext."""

    mod: IRModule
    target: Target
    params: Mapping[str, tvm.nd.NDArray]
    settings: PassSettings

    @classmethod
    def of(
        cls,
        mod: Any,
        target: TargetLike,
        params: ParamsLike,
        settings: PassSettings,
        *,
        target_host: TargetLike | None = None,
    ) -> Request:
        """Check and convert everything; the first problem found is raised as the package's
        error naming the fix."""
        tgt = as_target(target)
        if target_host is not None:
            tgt = Target(tgt, as_target(target_host))
        module = as_module(mod)
        return cls(module, tgt, as_params(params, module), settings)

    def with_model(self, mod: Any, params: ParamsLike) -> Request:
        """Another model under the same target and settings (a fleet extracted at once)."""
        module = as_module(mod)
        return replace(self, mod=module, params=as_params(params, module))
