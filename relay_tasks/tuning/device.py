"""Whether this machine can run code built for a target, decided before anything is measured.

Code built for an instruction this CPU lacks is no measurement failure but a SIGILL: a tune
records "Subprocess terminated" for most candidates and exits 0, and ``compile --benchmark`` is
killed after writing the library. LLVM names the features a target's ``-mcpu`` and ``-mattr``
select and the features this host has, so the mismatch is one line instead, before any build.
"""

from __future__ import annotations

import platform
import re
import time
from typing import Any

from ..errors import TargetError, TuningError

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
    from ..inputs import host_target

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


#: Seconds a tracker gets to answer, and a device to show up free there, before a tune starts.
TRACKER_TIMEOUT = 5.0


def check_tracker(tracker: tuple[str, int], key: str) -> None:
    """Raise :class:`TuningError` unless the tracker answers and a server with ``key`` is free
    there within :data:`TRACKER_TIMEOUT` seconds: a wrong address, a mistyped key or a dead
    device otherwise waits in silence for minutes."""
    deadline = time.monotonic() + TRACKER_TIMEOUT
    while True:
        problem = _tracker_problem(tracker, key)
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise TuningError(problem)
        time.sleep(0.25)


def _tracker_problem(tracker: tuple[str, int], key: str) -> str | None:
    """Why no measurement can start at ``tracker`` under ``key`` now, or None."""
    from ..rpc import tracker_summary

    where = f"{tracker[0]}:{tracker[1]}"
    try:
        summary = tracker_summary(tracker, TRACKER_TIMEOUT)
    except (OSError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or "no answer"
        return (f"no RPC tracker answers at {where} ({why}); start one "
                "(python -m tvm.exec.rpc_tracker) or fix --rpc-tracker")  # fmt: skip
    queues = summary.get("queue_info", {})
    if key not in queues:
        known = ", ".join(sorted(queues)) or "none"
        return (
            f"no device is registered at {where} under --rpc-key {key!r} (keys there: "
            f"{known}); start relay-tasks serve on the device with it, or fix --rpc-key"
        )
    if not int(queues[key].get("free", 0)):
        return f"every device under --rpc-key {key!r} at {where} is busy; wait for them, or add one"
    return None


def devices_left(tracker: tuple[str, int], key: str) -> str | None:
    """Why no device under ``key`` can measure any more (the tracker gone, or no server
    registered under the key, busy or free), or None. A server that dies drops its registration
    at once; the tracker hands the tune's next requests to the others."""
    from ..rpc import tracker_summary

    where = f"{tracker[0]}:{tracker[1]}"
    try:
        summary = tracker_summary(tracker, TRACKER_TIMEOUT)
    except (OSError, ValueError):
        return f"the RPC tracker at {where} stopped answering"
    servers = summary.get("server_info", [])
    if any(isinstance(s, dict) and s.get("key") == f"server:{key}" for s in servers):
        return None
    return f"no device is left under --rpc-key {key!r} at {where}"


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
