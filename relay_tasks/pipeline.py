"""Optimise a Relay module the way upstream's task extraction does, up to and including FuseOps.

Bind params, run the VM pass prefix (``relay.backend.GetPassPrefixSeq(True, True)``), then
``FuseOps``. What differs between tuners (PassContext config, disabled passes, opt level) arrives
here as a :class:`PassSettings` value, never as a flag naming a tuner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relay
from tvm.ir import IRModule
from tvm.ir.transform import PassContext
from tvm.target import Target

from .errors import ExtractionError, ModelError


@dataclass(frozen=True)
class PassSettings:
    """The PassContext an extraction runs under: what a tuner changes, as data."""

    opt_level: int = 3
    config: Mapping[str, Any] = field(default_factory=dict)
    disabled_pass: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.opt_level, int) or not 0 <= self.opt_level <= 4:
            raise ModelError(f"opt_level must be an integer from 0 to 4, got {self.opt_level!r}")

    def merged(
        self, config: Mapping[str, Any] | None = None, disabled_pass: Any = None
    ) -> PassSettings:
        """These settings with the user's extra config and disabled passes added on top."""
        return PassSettings(
            self.opt_level,
            {**self.config, **dict(config or {})},
            self.disabled_pass | frozenset(disabled_pass or ()),
        )

    def context(self) -> PassContext:
        return PassContext(
            opt_level=self.opt_level,
            config=dict(self.config),
            disabled_pass=sorted(self.disabled_pass),
        )


@contextlib.contextmanager
def extraction_scope(target: Target, settings: PassSettings) -> Iterator[None]:
    """Enter the target and PassContext that both optimisation and TE lowering read."""
    from tvm import autotvm

    silent = autotvm.GLOBAL_SCOPE.silent
    autotvm.GLOBAL_SCOPE.silent = True  # AlterOpLayout would log every missing AutoTVM config
    try:
        with target, settings.context():
            yield
    finally:
        autotvm.GLOBAL_SCOPE.silent = silent


def bind_params(mod: IRModule, params: Mapping[str, tvm.nd.NDArray]) -> IRModule:
    """Bind params into ``main`` by name, in a new module."""
    if not params:
        return mod
    bound = relay.build_module.bind_params_by_name(mod["main"], dict(params))
    result = IRModule(dict(mod.functions.items()), dict(mod.type_definitions.items()))
    for key, value in (mod.attrs or {}).items():
        result = result.with_attr(key, value)
    result["main"] = bound
    return result


def pass_sequence() -> tvm.transform.Pass:
    """Upstream's VM pass prefix followed by FuseOps, as one pass."""
    prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)
    return tvm.transform.Sequential([prefix, relay.transform.FuseOps()])


def optimize(mod: IRModule, params: Mapping[str, tvm.nd.NDArray]) -> IRModule:
    """Bind params and run the pass prefix and FuseOps. Call inside :func:`extraction_scope`."""
    try:
        return pass_sequence()(bind_params(mod, params))
    except tvm.TVMError as err:
        raise ExtractionError(f"Relay optimisation failed: {_last_line(err)}") from err


def _last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
