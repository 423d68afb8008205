"""Whether this machine can run code built for a target, decided before anything is measured.

Code built for an instruction this CPU lacks is no measurement failure but a SIGILL: a tune
records "Subprocess terminated" for most candidates and exits 0, and ``compile --benchmark`` is
killed after writing the library. LLVM names the features a target's ``-mcpu`` and ``-mattr``
select and the features this host has, so the mismatch is one line instead, before any build.
"""

from __future__ import annotations

import functools
import platform
import re
from typing import Any

from .errors import TargetError

#: Target kinds that measure on a device other than this CPU.
GPU_KINDS = frozenset({"cuda", "rocm", "vulkan", "opencl", "metal"})

#: The LLVM features checked against the host: instruction sets that generated code may use
#: (vector and scalar arithmetic, crypto and bit manipulation). Features outside it name
#: scheduling preferences (``fast-gather``, ``slow-shld``) or system instructions (``pku``,
#: ``wbnoinvd``) that a compiled operator never executes; a host may lack those and still run
#: the code.
CHECKED_FEATURES = re.compile(
    r"(sse|ssse|avx|amx|fma|f16c|xop|bmi|tbm|lzcnt|popcnt|gfni|vaes|vpclmulqdq|aes|pclmul|"
    r"sha|sm3|sm4|adx|movbe|cx16|neon|sve|sme|dotprod|i8mm|bf16|fullfp16|fp16fml|fp-armv8|"
    r"crypto|rvv|zv|[mafdcv]$)"
)

_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def check_runs_here(target: Any, *, doing: str) -> None:
    """Raise :class:`TargetError` unless this machine can run ``target``'s code.

    ``doing`` names what would run (``"measure"``, ``"benchmark"``) for the message.
    """
    import tvm

    kind = target.kind.name
    if kind in GPU_KINDS and not tvm.device(kind, 0).exist:
        raise TargetError(
            f"this machine has no {kind} device to {doing} on: tune for it through a tracker "
            "(--rpc-tracker HOST:PORT --rpc-key KEY, with relay-tasks serve on the device)"
        )
    if kind != "llvm":
        return
    from .inputs import host_target

    here = _ARCH_ALIASES.get(platform.machine(), platform.machine())
    arch = target_arch(target)
    shown = str(target).strip()
    if arch != here:
        raise TargetError(
            f"the target '{shown}' builds {arch} code, which this {here} machine cannot "
            f"{doing}: {doing} on such a device (--rpc-tracker HOST:PORT --rpc-key KEY), or "
            f"use this machine's target: --target '{host_target()}'"
        )
    missing = missing_features(target)
    if missing:
        raise TargetError(
            f"this machine's CPU lacks {', '.join(missing)}, which code for '{shown}' uses: "
            f"it would die of an illegal instruction; {doing} on a device that has them "
            f"(--rpc-tracker HOST:PORT --rpc-key KEY), or use this machine's target: "
            f"--target '{host_target()}'"
        )


def target_arch(target: Any) -> str:
    """The architecture an llvm target generates code for: its ``-mtriple``'s first part, or
    LLVM's default triple's (riscv64 in hhb-tvm)."""
    import tvm

    triple = str(target.attrs.get("mtriple", "")) or str(
        tvm.get_global_func("tvm.codegen.llvm.GetDefaultTargetTriple")()
    )
    arch = triple.split("-", 1)[0]
    return _ARCH_ALIASES.get(arch, arch)


def missing_features(target: Any) -> list[str]:
    """The instruction-set features ``target`` selects that this CPU does not have."""
    import tvm
    from tvm.target import codegen

    features = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
    host = {str(name): bool(has) for name, has in features.items()}
    wanted = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    return sorted(f for f in wanted if host.get(f) is False and CHECKED_FEATURES.match(f))


@functools.cache
def _fma_peak(target_text: str) -> float | None:
    import tvm
    from tvm.utils.roofline.x86 import estimate_peak_fma_vector_flops

    target = tvm.target.Target(target_text)
    if target.kind.name != "llvm" or not str(target.attrs.get("mtriple", "")).startswith("x86"):
        return None
    try:
        return float(estimate_peak_fma_vector_flops(target, tvm.cpu(), None, "float32"))
    except Exception:  # a target TVM's roofline cannot size: weighing then goes without it
        return None


def fma_peak(target: Any) -> float | None:
    """FLOP/s this CPU's FMA units sustain on every core, in float32 (TVM's roofline test,
    about a second, once a process), for x86 targets run here; None elsewhere. What a task's
    FLOPs can cost at best, so that a tune leaves tasks already there to the others."""
    return _fma_peak(str(target))
