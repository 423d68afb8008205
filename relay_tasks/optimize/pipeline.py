"""Optimise a Relay module the way upstream's task extraction does, up to and including FuseOps.

Bind params, run the VM pass prefix (``relay.backend.GetPassPrefixSeq(True, True)``), then
``FuseOps``. What differs between tuners (PassContext config, disabled passes, opt level) arrives
here as a :class:`PassSettings` value, never as a flag naming a tuner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relay
from tvm.ir import IRModule
from tvm.ir.transform import PassContext
from tvm.target import Target

from ..errors import ExtractionError, ModelError, RelayTasksError, describe_failure
from ..inputs import type_check
from ..ir import (
    dunders_answered_in_python,
    pointers_made_cheaply,
    reads_shared,
    stand_in,
    with_functions,
)
from .fold import FoldConstant
from .gates import (
    OP_TRIGGERS,
    CanonicalizeCast,
    EliminateCommonSubexpr,
    EtaExpand,
    FoldScaleAxis,
    Legalize,
    QnnLegalize,
    ToBasicBlockNormalForm,
    op_gated,
)
from .placeholders import deferred_placeholders, fill_all, fill_inside_tasks, filled_on_read
from .simplify import SimplifyExpr, SimplifyExprPostAlterOp


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
        with (
            target,
            settings.context(),
            memoized_cpu_features(),
            dunders_answered_in_python(),
            pointers_made_cheaply(),
        ):
            yield
    finally:
        autotvm.GLOBAL_SCOPE.silent = silent


@contextlib.contextmanager
def memoized_cpu_features() -> Iterator[None]:
    """Answer TOPI's "does this target have CPU feature X" once per target and feature.

    Each answer builds an LLVM target machine (0.7 ms), and x86's layout and schedule hooks ask
    for every operator call: 200 times on a ResNet-50. The answer depends only on the feature
    and the target (triple, CPU, attributes), which make the key.
    """
    from tvm.target import _ffi_api as target_api

    ask = target_api.target_has_feature
    known: dict[tuple[str, str], Any] = {}

    def remembered(feature: str, target: Any = None) -> Any:
        key = (str(feature), str(target if target is not None else Target.current()))
        if key not in known:
            known[key] = ask(feature, target)
        return known[key]

    target_api.target_has_feature = remembered
    try:
        yield
    finally:
        target_api.target_has_feature = ask


def bind_params(mod: IRModule, params: Mapping[str, tvm.nd.NDArray]) -> IRModule:
    """Bind params into ``main`` by name, in a new module."""
    if not params:
        return mod
    bound = relay.build_module.bind_params_by_name(mod["main"], dict(params))
    return with_functions(mod, {"main": bound})


@dataclass(frozen=True)
class Group:
    """A named group of passes, enabled or disabled as a whole (upstream: a ``Sequential``)."""

    name: str
    passes: tuple[Step, ...]
    opt_level: int = 0


Step = Any  # a tvm.transform.Pass or a Group (TVM ships no type information)


def pass_prefix() -> list[Step]:
    """Upstream's ``GetPassPrefix(is_homogeneous=True, is_vm=True)``, with our constant folder.

    Same passes, same order, same names and opt levels (a test compares the passes run with
    upstream's sequence); only the constant folding inside ``FoldConstant`` and ``FoldScaleAxis``
    is ours, and the simplification passes and those that rewrite only a few ops
    (``qnn.Legalize``, :data:`~relay_tasks.optimize.gates.OP_TRIGGERS`) are skipped where they would
    change nothing.
    """
    transform = relay.transform
    return [
        transform.RemoveUnusedFunctions(["main"]),
        ToBasicBlockNormalForm(),
        # C++'s qnn.Legalize (QnnLegalize then QnnCanonicalize); the Python helper of the same
        # name only legalizes.
        QnnLegalize(),
        Legalize(),
        op_gated(transform.SimplifyInference()),
        EtaExpand(),
        # Upstream passes a skip callback that always answers "no": the same as none.
        EliminateCommonSubexpr(),
        transform.CombineParallelConv2D(min_num_branches=3),
        transform.CombineParallelDense(min_num_branches=3),
        transform.CombineParallelBatchMatmul(min_num_branches=3),
        FoldConstant(),
        Group(
            "FoldScaleAxis",
            (
                FoldScaleAxis(transform.BackwardFoldScaleAxis()),
                FoldScaleAxis(transform.ForwardFoldScaleAxis()),
                FoldConstant(),
            ),
        ),
        SimplifyExpr(),
        CanonicalizeCast(),
        op_gated(transform.CanonicalizeOps()),
        op_gated(transform.FlattenAtrousConv()),
        # Its Python layout hooks are given the weights; what they read is computed then.
        _reads_filled(transform.AlterOpLayout()),
        SimplifyExprPostAlterOp(),
        transform.FastMath(),
        FoldConstant(),
    ]


def run_passes(steps: Sequence[Step], mod: IRModule, *, typed: bool = False) -> IRModule:
    """Run passes as upstream's ``Sequential`` does, minus type inference that changes nothing.

    Like ``Sequential``: a pass runs if the current PassContext enables it (not disabled; opt
    level high enough, or required), after the passes it requires. Unlike it, a required
    ``InferType`` is skipped when the module is already typed: every Relay function pass ends by
    inferring types itself, so the next pass's required ``InferType`` only rebuilds an unchanged
    module (about 0.1 s per call on ResNet-50). ``typed`` says that ``mod`` comes from type
    inference.
    """
    runner = _Runner(PassContext.current())
    if typed:
        runner.typed_now(mod)
    return runner.run(steps, mod)


class _Runner:
    def __init__(self, ctx: PassContext) -> None:
        self.ctx = ctx
        self.disabled = {str(name) for name in ctx.disabled_pass}
        self.required = {str(name) for name in ctx.required_pass}
        self.typed: dict[Any, Any] | None = None

    def enabled(self, name: str, opt_level: int) -> bool:
        if name in self.disabled:
            return False
        return name in self.required or int(self.ctx.opt_level) >= opt_level

    def run(self, steps: Sequence[Step], mod: IRModule) -> IRModule:
        for step in steps:
            if isinstance(step, Group):
                if self.enabled(step.name, step.opt_level):
                    mod = self.run(step.passes, mod)
                continue
            info = step.info
            if not self.enabled(str(info.name), int(info.opt_level)):
                continue
            for name in info.required:
                if str(name) == "InferType" and self._still_typed(mod):
                    continue
                mod = _named_pass(str(name))(mod)
                if str(name) == "InferType":
                    self.typed_now(mod)
            if str(info.name) not in _FILLS_WHAT_IT_READS:
                fill_all()
            mod = step(mod)
            if isinstance(step, relay.transform.FunctionPass) or info.name in _TYPED_OUTPUT:
                self.typed_now(mod)
        return mod

    def typed_now(self, mod: IRModule) -> None:
        # The typed functions themselves, not the module: TVM's EtaExpand replaces the functions
        # of the module it is given, in place, by untyped ones.
        self.typed = dict(mod.functions.items())

    def _still_typed(self, mod: IRModule) -> bool:
        typed = self.typed
        if typed is None:
            return False
        ours = dict(mod.functions.items())
        return len(ours) == len(typed) and all(
            gvar in typed and func.same_as(typed[gvar]) for gvar, func in ours.items()
        )


#: Steps that read no constant's value, or compute the deferred ones they read (see
#: :func:`~relay_tasks.optimize.fold.deferred_placeholders`): every other step runs only once all of
#: them are computed.
_FILLS_WHAT_IT_READS = frozenset(
    {
        "FoldConstant",  # ours: numpy asks for what it reads; TVM's runs after fill_all
        "SimplifyExpr",  # ours: screens read scalars only; TVM's pass runs on filled cuts
        "SimplifyExprPostAlterOp",
        "BackwardFoldScaleAxis",  # gated: fills all where it runs
        "ForwardFoldScaleAxis",
        "AlterOpLayout",  # C++ reads none; Python hooks fill on read
        "CanonicalizeCast",  # C++ rewrites of casts, bias_add, space_to_batch_nd: no reads
        "CanonicalizeOps",
        "FlattenAtrousConv",
        "FastMath",
        "FuseOps",
    }
)


def _reads_filled(real: tvm.transform.Pass) -> tvm.transform.Pass:
    """``real``, with every constant its Python hooks read computed first."""

    def run(mod: IRModule) -> IRModule:
        with filled_on_read():
            return real(mod)

    return stand_in(real, run)


#: Our module passes, which like the function passes they stand in for return typed modules.
_TYPED_OUTPUT = frozenset(
    {
        "AlterOpLayout",
        "FoldConstant",
        "SimplifyExpr",
        "SimplifyExprPostAlterOp",
        "Legalize",
        "EliminateCommonSubexpr",
        "CanonicalizeCast",
        *OP_TRIGGERS,
    }
)


def _named_pass(name: str) -> tvm.transform.Pass:
    """Create a pass from its name, looking where upstream's ``GetPass`` looks."""
    for key in (name, f"transform.{name}", f"relay._transform.{name}"):
        factory = tvm.get_global_func(key, allow_missing=True)
        if factory is not None:
            return factory()
    raise ExtractionError(f"cannot create the pass {name!r} that another pass requires")


def FuseOps() -> tvm.transform.Pass:
    """``relay.transform.FuseOps()`` without the type inference over the whole module that
    TVM's function passes end with, where no pass instrument watches the passes.

    The fused module is read for its primitive functions, one per task, which can be typed one
    at a time (their parameters carry their types); re-typing the module types every node of
    every occurrence: 23 ms of the ONNX BERT's 0.21 s, 60 ms of a ResNet-50 from ONNX. TVM
    skips a pass that an instrument of the PassContext says not to run; the fusion runs under
    a copy of the current context with one instrument, which declines ``InferType``. Under a
    context with instruments of its own (a user timing the passes, say), the pass runs as is.
    """
    real = relay.transform.FuseOps()

    def run(mod: IRModule) -> IRModule:
        ctx = PassContext.current()
        if list(ctx.instruments):
            return real(mod)
        with PassContext(
            int(ctx.opt_level),
            required_pass=list(ctx.required_pass),
            disabled_pass=list(ctx.disabled_pass),
            instruments=[_NotTyping()],
            config=dict(ctx.config),
        ):
            return real(mod)

    return stand_in(real, run)


@tvm.instrument.pass_instrument
class _NotTyping:
    """Declines every ``InferType`` (a pass the context requires runs all the same)."""

    def should_run(self, mod: IRModule, info: tvm.transform.PassInfo) -> bool:
        return str(info.name) != "InferType"


#: TOPI's layout hooks that ask the op strategy for an implementation only to read its name
#: and AutoTVM workload.
_LAYOUT_HOOKS = ("conv2d_alter_layout", "dense_alter_layout")


@contextlib.contextmanager
def memoized_layout_hooks() -> Iterator[None]:
    """Inside TOPI's conv2d and dense layout hooks, remember the op strategy's choice per
    distinct call.

    ``AlterOpLayout`` calls the hook once per convolution, and the hook builds the chosen
    implementation's TE compute each time to read its workload: 53 times (0.2-0.4 s) on a
    ResNet-50 for a score of distinct convolutions. The choice depends only on the op, its
    attributes, input and output types, target and AutoTVM context, which make the key.
    Only inside the hooks: elsewhere (TVM's own constant folding) the returned tensors are
    lowered, and another call's tensors must never be reused there.
    """
    from tvm import topi
    from tvm.relay.backend import te_compiler

    select = te_compiler.select_implementation
    chosen: dict[tuple[Any, ...], Any] = {}

    def remembered(
        op: Any, attrs: Any, inputs: Any, out_type: Any, target: Any, use_autotvm: bool = True
    ) -> Any:
        key = _implementation_key(op, attrs, inputs, out_type, target, use_autotvm)
        if key is None:
            return select(op, attrs, inputs, out_type, target, use_autotvm)
        if key not in chosen:
            chosen[key] = select(op, attrs, inputs, out_type, target, use_autotvm)
        return chosen[key]

    def inside(hook: Any) -> Any:
        def hooked(*args: Any) -> Any:
            te_compiler.select_implementation = remembered
            try:
                return hook(*args)
            finally:
                te_compiler.select_implementation = select

        return hooked

    hooks = {name: getattr(topi.nn, name) for name in _LAYOUT_HOOKS}
    for name, hook in hooks.items():
        setattr(topi.nn, name, inside(hook))
    try:
        yield
    finally:
        for name, hook in hooks.items():
            setattr(topi.nn, name, hook)


def _implementation_key(
    op: Any, attrs: Any, inputs: Any, out_type: Any, target: Any, use_autotvm: bool
) -> tuple[Any, ...] | None:
    """What the op strategy's choice depends on; None for run-time dimensions."""
    from tvm import autotvm

    shapes = []
    for tensor in inputs:
        dims = list(tensor.shape)
        if not all(isinstance(d, tvm.tir.IntImm) for d in dims):
            return None
        shapes.append((tuple(int(d) for d in dims), str(tensor.dtype)))
    described = tvm.ir.save_json(attrs) if attrs is not None else ""
    return (
        str(op.name),
        described,
        tuple(shapes),
        tvm.ir.save_json(out_type),
        str(target),
        use_autotvm,
        id(autotvm.DispatchContext.current),
    )


def optimize(
    mod: IRModule, params: Mapping[str, tvm.nd.NDArray], *, typed: bool = True
) -> IRModule:
    """Bind params and run the pass prefix and FuseOps. Call inside :func:`extraction_scope`.

    With ``typed=False`` the fused module may be left untyped (see :func:`FuseOps`): for a
    caller that types the primitive functions it reads itself.
    """
    try:
        steps = [*pass_prefix(), relay.transform.FuseOps() if typed else FuseOps()]
        with deferred_placeholders(), memoized_layout_hooks(), reads_shared():
            fused = run_passes(steps, type_check(bind_params(mod, params)), typed=True)
            fill_inside_tasks(fused)
        return fused
    except RelayTasksError:
        raise
    except Exception as err:  # TOPI's legalize / alter-layout hooks raise anything at all
        target = tvm.target.Target.current(allow_none=False)  # extraction_scope's
        raise ExtractionError(
            f"TVM failed to optimise the model for {target.kind.name}: {describe_failure(err)} "
            "(raised by TVM's own passes, which upstream's extraction runs too; another layout "
            "or target for this op may avoid it)"
        ) from err
