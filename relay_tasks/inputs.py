"""Normalise what users pass in (module, target, params) once, at the API boundary.

Every tuner entry point accepts the same loose types (an ``IRModule`` or a Relay ``Function``, a
target string or ``Target``, params as numpy arrays or ``NDArray``) and turns them into one strict
form here, so that the pipeline never has to guess and bad input fails early with a message that
names the fix instead of deep inside a C++ pass.
"""

from __future__ import annotations

import difflib
import functools
import platform
from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
from tvm import relay
from tvm.ir import IRModule
from tvm.target import Target

from .errors import ModelError, TargetError, UnusedParamsWarning, warn
from .ir import diagnostic_text, diagnostics, with_functions

ModuleLike = IRModule | relay.Function
TargetLike = str | Target
ParamsLike = Mapping[str, Any] | None


def as_module(mod: Any) -> IRModule:
    """Return a fresh ``IRModule`` whose ``main`` is a Relay function.

    The result is a new module object: binding params later must never modify the caller's module
    (upstream's C++ extraction does, which makes a second extraction of the same module see no
    params to bind). Its types are checked once the params are bound (:func:`type_check`, from
    the pipeline), not here: the bound module must be typed anyway, and checking both costs a
    whole-graph type inference more (40 ms on ResNet-50).
    """
    if isinstance(mod, relay.Function):
        mod = IRModule.from_expr(mod)
    elif not isinstance(mod, IRModule):
        raise ModelError(
            f"expected a tvm.IRModule or tvm.relay.Function, got {type(mod).__name__}; "
            "load a model with relay_tasks.load_model() or a relay.frontend converter first"
        )
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if "main" not in names:
        found = ", ".join(sorted(names)) or "no functions"
        raise ModelError(
            f"the module has no 'main' function (it has {found}); "
            "name the entry function 'main', e.g. mod = tvm.IRModule.from_expr(func)"
        )
    if not isinstance(mod["main"], relay.Function):
        raise ModelError(
            f"'main' is a {type(mod['main']).__name__}, not a Relay function; "
            "relay-tasks extracts from Relay models only"
        )
    return with_functions(mod, {})


def type_check(mod: IRModule) -> IRModule:
    """Run type inference, turning TVM's rendered diagnostics into one ``ModelError``."""
    with diagnostics() as messages:
        try:
            return relay.transform.InferType()(mod)
        except tvm.TVMError as err:
            raise ModelError(
                f"the module does not type-check: {diagnostic_text(messages, err)}; fix the "
                "operator shapes/dtypes (relay.transform.InferType()(mod) reproduces this)"
            ) from err


def host_target() -> Target:
    """The CPU this process runs on, spelled out.

    hhb-tvm's LLVM defaults to a riscv64 triple, so a bare ``llvm`` would describe another machine.
    """
    from tvm.target import codegen

    triple = f"{platform.machine()}-linux-gnu"
    return Target(f"llvm -mtriple={triple} -mcpu={codegen.llvm_get_system_cpu()}")


def as_target(target: object) -> Target:
    """Parse a target string (or pass a ``Target`` through), with a readable error."""
    if isinstance(target, Target):
        return target
    if not isinstance(target, str):
        raise TargetError(
            f"expected a target string or tvm.target.Target, got {type(target).__name__}; "
            "e.g. 'llvm -mtriple=x86_64-linux-gnu -mcpu=skylake' or 'cuda'"
        )
    try:
        parsed = Target(target)
    except (ValueError, tvm.TVMError) as err:
        kind = target.split()[0] if target.split() else target
        known = ", ".join(sorted(Target.list_kinds()))
        raise TargetError(
            f"unknown or malformed target {target!r} (kind {kind!r}); "
            f"use one of the target kinds {known}, e.g. "
            "'llvm -mtriple=x86_64-linux-gnu -mcpu=skylake' or 'cuda'"
        ) from err
    _check_cpu(parsed)
    return parsed


def _check_cpu(target: Target) -> None:
    """LLVM takes any ``-mcpu`` and only warns when it generates code: a typo would tune and
    build for a generic CPU. Check it against the CPUs LLVM knows for the target's triple."""
    cpu = str(target.attrs.get("mcpu", "")) if target.kind.name == "llvm" else ""
    if not cpu:
        return
    triple = str(target.attrs.get("mtriple", ""))
    known = _llvm_cpus(triple)
    if known and cpu not in known:
        close = difflib.get_close_matches(cpu, known, n=4)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        where = triple or "the default triple (riscv64 in hhb-tvm: give -mtriple=...)"
        raise TargetError(
            f"-mcpu={cpu} is not a CPU LLVM knows for {where}; {hint}"
            f"the {len(known)} it knows include {', '.join(known[:12])} ..."
        )


@functools.lru_cache(maxsize=16)
def _llvm_cpus(triple: str) -> tuple[str, ...]:
    """The CPU names LLVM accepts for a triple (empty if this TVM cannot say)."""
    archlist = tvm.get_global_func("target.llvm_get_cpu_archlist", True)
    if archlist is None:
        return ()
    probe = Target(f"llvm -mtriple={triple}" if triple else "llvm")
    try:
        return tuple(str(name) for name in archlist(probe))
    except tvm.TVMError:
        return ()


def _check_param_type(var: Any, value: tvm.nd.NDArray) -> None:
    """A param must fit the type ``main`` declares for it, or binding it fails deep in the type
    checker; say which param, and both shapes, here."""
    declared = var.type_annotation
    if not isinstance(declared, tvm.ir.TensorType):
        return
    want = [int(d) if isinstance(d, tvm.tir.IntImm) else None for d in declared.shape]
    got = [int(d) for d in value.shape]
    fits = len(want) == len(got) and all(w in (None, g) for w, g in zip(want, got, strict=True))
    if not fits or declared.dtype != value.dtype:
        shown = "x".join("?" if w is None else str(w) for w in want) or "scalar"
        raise ModelError(
            f"param {var.name_hint!r} is {'x'.join(map(str, got)) or 'scalar'} {value.dtype}, "
            f"but main declares {var.name_hint!r} as {shown} {declared.dtype}; "
            "pass the weights this model was built with"
        )


def as_params(params: object, mod: IRModule) -> dict[str, tvm.nd.NDArray]:
    """Convert params to ``NDArray``, keeping those that name a parameter of ``main``.

    Accepts a ``dict`` or the ``tvm.ir.Map`` that ``relay.load_param_dict`` returns. Upstream
    binds the params whose names match and ignores the rest without a word. Frontends do return
    extra params (a model traced in training mode keeps BatchNorm's ``num_batches_tracked``
    updates, which ``main`` never reads), so those are left out with one warning; but params of
    which none match are the weights of another model, and binding nothing would silently give
    the tasks of an unweighted model: that is an error.
    """
    if params is None:
        return {}
    if isinstance(params, tvm.ir.container.Map):  # what relay.load_param_dict returns
        params = dict(params.items())
    if not isinstance(params, Mapping):
        raise ModelError(
            f"expected params as a dict (or tvm.ir.Map) of name -> numpy array / "
            f"tvm.nd.NDArray, got {type(params).__name__}"
        )
    main = mod["main"]
    var_names = [p.name_hint for p in main.params]
    converted: dict[str, tvm.nd.NDArray] = {}
    for name, value in params.items():
        if not isinstance(name, str):
            raise ModelError(f"param names must be strings, got {name!r}")
        if isinstance(value, np.ndarray):
            value = tvm.nd.array(value)
        elif not isinstance(value, tvm.nd.NDArray):
            raise ModelError(
                f"param {name!r} is a {type(value).__name__}; pass a numpy array or tvm.nd.NDArray"
            )
        converted[name] = value
    unknown = sorted(set(converted) - set(var_names))
    if unknown:
        _unmatched(unknown, var_names, none_match=len(unknown) == len(converted))
        converted = {name: value for name, value in converted.items() if name in var_names}
    for var in main.params:
        if var.name_hint in converted:
            _check_param_type(var, converted[var.name_hint])
    repeated = sorted({n for n in var_names if var_names.count(n) > 1} & set(converted))
    if repeated:
        raise ModelError(
            f"main has several parameters named {repeated[0]!r}, so the param cannot be bound "
            "by name; rename the duplicated variables"
        )
    return converted


def _unmatched(unknown: list[str], var_names: list[str], *, none_match: bool) -> None:
    """Params that name no parameter of ``main``: an error when none match, else a warning."""
    shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
    if none_match:
        free = ", ".join(var_names[:8]) + (" ..." if len(var_names) > 8 else "")
        raise ModelError(
            f"none of the {len(unknown)} param(s) match a parameter of main: {shown}; "
            f"main's parameters are: {free or '(none)'}; these look like another model's "
            "weights: pass this model's params, or none"
        )
    warn(
        f"{len(unknown)} param(s) match no parameter of main and are not bound: {shown}; "
        "drop them from params to silence this (upstream ignores them without a word)",
        UnusedParamsWarning,
    )
