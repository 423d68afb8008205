"""A fixture-only patch that gives hhb-tvm's elementwise strategies a CUDA schedule.

hhb-tvm registers ``add``, ``subtract``, ``multiply``, ``divide`` and ``reshape`` with strategies
whose schedule supports llvm/c only, so any compile-based path (``relay.build``, the VM compiler,
upstream AutoTVM and Ansor extraction) fails on a CUDA target. Our extraction never schedules and
does not need this. To compare with upstream on CUDA anyway, tests wrap the *upstream* call in
:func:`cuda_injective_schedules`: the same computes, with ``topi.cuda.schedule_injective`` as
schedule for CUDA targets, and the original strategy everywhere else. Leaving the block restores
the original strategies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tvm import relay, topi
from tvm.relay.op import op as _op
from tvm.relay.op.strategy.generic import wrap_topi_schedule
from tvm.relay.testing.temp_op_attr import TempOpAttr

PATCHED_OPS = ("add", "subtract", "multiply", "divide", "reshape")


def _with_cuda_schedule(original):
    def strategy(attrs, inputs, out_type, target):
        stock = original(attrs, inputs, out_type, target)
        if "cuda" not in target.keys:
            return stock
        patched = _op.OpStrategy()
        for spec in stock.specializations:
            for impl in spec.implementations:
                patched.add_implementation(
                    lambda a, i, o, impl=impl: impl.compute(a, i, o),
                    wrap_topi_schedule(topi.cuda.schedule_injective),
                    name=impl.name,
                    plevel=impl.plevel,
                )
        return patched

    return strategy


@contextlib.contextmanager
def cuda_injective_schedules() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name in PATCHED_OPS:
            original = relay.op.get(name).get_attr("FTVMStrategy")
            stack.enter_context(TempOpAttr(name, "FTVMStrategy", _with_cuda_schedule(original)))
        yield
