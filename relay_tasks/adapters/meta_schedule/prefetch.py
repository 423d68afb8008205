"""Prefetching the next chunk of a weight a tuned kernel reuses, while it reuses this one.

MetaSchedule rewrites a weight (a dense's, a convolution's) to the order its kernel reads it:
one contiguous chunk per turn of a reduction loop, read again on every turn of the loop inside
it that takes other rows of the data. In a model each weight comes from memory once a run, so
the first pass over a chunk waits for memory and the others hit cache; the kernel's record,
timed over and over with its weight in cache, never waited. Here, on each turn of that reuse
loop, a share of the next chunk's cache lines is prefetched, so the next chunk is on its way
while this one is reused. A prefetch is a hint: it changes no result, and an address past
the weight is clamped to its last element.

BERT-2 built with its 10-minute records, both builds timed in one run (docs/benchmarks.md):
17.09 ms without, 16.06 with, where 4 functions (its dense layers) get prefetches; its FFN
dense layer, timed alone with its weight flushed from cache, 2.48 against 2.38 ms a call.
ResNet-50 (2 functions with prefetches), the Llama decoder (1) and MobileNetV2 (none) run as
fast as without, within the spread of their repeats; so does another BERT-2 tune's records,
of which one function matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import tvm
from tvm import tir

#: Bytes a prefetch brings in: one cache line.
LINE_BYTES = 64

#: Chunks smaller than this are left to the hardware: their prefetch loop would cost more than
#: the wait it saves.
MIN_CHUNK_BYTES = 4096


class _Next(NamedTuple):
    """The chunk a reuse loop prefetches a share of on each of its turns."""

    buffer: tir.Buffer
    start: tir.PrimExpr  # the next chunk's first element, in the loops outside the reuse loop
    lines: int  # cache lines in a chunk


def prefetch_weights() -> tvm.transform.Pass:
    """The pass (for ``tir.add_lower_pass``, phase 1: buffers flattened, loops not yet
    vectorized) that adds the prefetches to each function with layout-free weights."""

    @tvm.tir.transform.prim_func_pass(  # type: ignore[untyped-decorator]
        opt_level=0, name="relay_tasks.PrefetchWeights"
    )
    def run(func: tir.PrimFunc, _mod: Any, _ctx: Any) -> tir.PrimFunc:
        plans = _plans(func)
        if not plans:
            return func

        def add(loop: tir.Stmt) -> tir.Stmt | None:
            found = plans.get(loop.loop_var)
            if found is None:
                return None
            body = tir.SeqStmt([_prefetches(found, loop), loop.body])
            return tir.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                           loop.thread_binding, loop.annotations)  # fmt: skip

        return func.with_body(tir.stmt_functor.ir_transform(func.body, None, add, ["tir.For"]))

    return run


def _plans(func: tir.PrimFunc) -> dict[tir.Var, _Next]:
    """For each reuse loop (by its variable), the chunk it prefetches."""
    attrs = dict(func.attrs.items()) if func.attrs is not None else {}
    free = attrs.get("layout_free_buffers", [])
    weights = {func.buffer_map[func.params[int(i)]].data for i in free}
    plans: dict[tir.Var, _Next] = {}

    def walk(stmt: tir.Stmt, loops: list[tir.For]) -> None:
        if isinstance(stmt, tir.For):
            walk(stmt.body, [*loops, stmt])
        elif isinstance(stmt, tir.SeqStmt):
            for part in stmt.seq:
                walk(part, loops)
        elif isinstance(stmt, tir.IfThenElse):
            walk(stmt.then_case, loops)
            if stmt.else_case is not None:
                walk(stmt.else_case, loops)
        elif isinstance(stmt, tir.BufferStore):
            loads: list[tir.BufferLoad] = []

            def note(node: Any) -> None:
                if isinstance(node, tir.BufferLoad) and node.buffer.data in weights:
                    loads.append(node)

            tir.stmt_functor.post_order_visit(stmt.value, note)
            for load in loads:
                _plan(load, loops, plans)
        elif isinstance(getattr(stmt, "body", None), tir.Stmt):
            walk(stmt.body, loops)

    if weights:
        walk(func.body, [])
    return plans


def _plan(load: tir.BufferLoad, loops: Sequence[tir.For], plans: dict[tir.Var, _Next]) -> None:
    """Where ``load`` reads its weight a chunk per turn of a loop whose first inner loop reuses
    the chunk, file that chunk under the reuse loop: the innermost such loop below the
    parallel one, with a chunk of :data:`MIN_CHUNK_BYTES` or more."""
    parallel = [i for i, loop in enumerate(loops) if loop.kind == tir.ForKind.PARALLEL]
    inside = list(loops[parallel[-1] + 1 :] if parallel else loops)
    if len(load.indices) != 1 or isinstance(load.indices[0], tir.Ramp) or len(inside) < 2:
        return
    sized = [*(loop.extent for loop in inside), *load.buffer.shape]
    if not all(isinstance(extent, tir.IntImm) for extent in sized):
        return
    coefficients = tvm.arith.detect_linear_equation(
        load.indices[0], [loop.loop_var for loop in inside]
    )
    if len(coefficients) != len(inside) + 1 or not all(
        isinstance(c, tir.IntImm) for c in coefficients[:-1]
    ):
        return
    steps = [int(c) for c in coefficients[:-1]]
    extents = [int(loop.extent) for loop in inside]
    bytes_per = tvm.DataType(load.buffer.dtype).bits // 8
    for r in reversed(range(len(inside) - 1)):
        step, reuse = steps[r], r + 1
        if step <= 0 or extents[r] < 2 or steps[reuse] != 0 or extents[reuse] < 2:
            continue
        span = sum(s * (e - 1) for s, e in zip(steps[reuse:], extents[reuse:], strict=True)) + 1
        if span != step or step * bytes_per < MIN_CHUNK_BYTES:
            continue
        inner = {loop.loop_var: tir.const(0, loop.loop_var.dtype) for loop in inside[reuse:]}
        start = tir.stmt_functor.substitute(load.indices[0], inner) + step
        lines = -(-step * bytes_per // LINE_BYTES)
        plans.setdefault(inside[reuse].loop_var, _Next(load.buffer, start, lines))
        return


def _prefetches(found: _Next, reuse: tir.For) -> tir.Stmt:
    """A loop prefetching this turn's share of the next chunk."""
    per_line = LINE_BYTES * 8 // tvm.DataType(found.buffer.dtype).bits
    share = -(-found.lines // int(reuse.extent))
    line = tir.Var("line", found.start.dtype)
    last = tir.const(int(found.buffer.shape[0]) - 1, found.start.dtype)
    first = found.start + reuse.loop_var * (share * per_line)
    element = tir.min(first + line * per_line, last)
    address = tir.call_intrin("handle", "tir.address_of", tir.BufferLoad(found.buffer, [element]))
    # Read, into the outer caches (locality 1): the chunk being reused keeps the inner ones.
    hint = tir.Evaluate(tir.call_intrin("int32", "tir.prefetch", address, 0, 1, 1))
    zero = tir.const(0, line.dtype)
    return tir.For(line, zero, tir.const(share, line.dtype), tir.ForKind.SERIAL, hint)
