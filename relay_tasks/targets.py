"""Targets read from files, parsed here through an allowlist before TVM sees them.

A target string is a small program for TVM and LLVM: an ``llvm`` target's ``-cl-opt`` goes to
LLVM's command-line parser, which can make LLVM write files where it is told and run a program
it is named, and ``-libs`` links external libraries. So a target that arrives in a file (a task
file, a work dir's ``tasks.json``, a tuning record) may only be one of the kinds relay-tasks
tunes for, with the attributes that choose what code is generated, each value a plain token of
its type. A target the user types on the command line keeps TVM's whole grammar.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Check = Callable[[str], bool]


def _token(pattern: str) -> Check:
    compiled = re.compile(pattern + r"\Z")
    return lambda value: bool(compiled.match(value))


def _integer(low: int, high: int) -> Check:
    return lambda value: value.isdigit() and low <= int(value) <= high


#: A name LLVM or TVM knows (a CPU, a triple, a board, a device class).
_NAME = _token(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_KEYS = _token(r"[a-z0-9_]{1,32}(,[a-z0-9_]{1,32}){0,7}")
_FLAG = _integer(0, 1)
_COUNT = _integer(1, 1 << 20)
_BYTES = _integer(1, 1 << 40)

#: Per target kind, the attributes a file may set and what each value must look like.
ALLOWED: Mapping[str, Mapping[str, Check]] = {
    "llvm": {
        "keys": _KEYS,
        "mtriple": _NAME,
        "mcpu": _NAME,
        "mattr": _token(r"[+\-][A-Za-z0-9_.\-]{1,40}(,[+\-][A-Za-z0-9_.\-]{1,40}){0,127}"),
        "mabi": _NAME,
        "mfloat-abi": _token(r"hard|soft|softfp"),
        "model": _NAME,
        "device": _NAME,
        "num-cores": _COUNT,
        "opt-level": _integer(0, 3),
        "vector-width": _COUNT,
        "vlen": _COUNT,
        "rlen": _COUNT,
        **{
            name: _FLAG
            for name in (
                "fast-math",
                "fast-math-nnan",
                "fast-math-ninf",
                "fast-math-nsz",
                "fast-math-arcp",
                "fast-math-contract",
                "fast-math-reassoc",
            )
        },
    },
    "cuda": {
        "keys": _KEYS,
        "arch": _token(r"sm_[0-9]{2,3}[a-z]?"),
        "model": _NAME,
        "max_num_threads": _COUNT,
        "max_threads_per_block": _COUNT,
        "max_shared_memory_per_block": _BYTES,
        "max_local_memory_per_block": _BYTES,
        "thread_warp_size": _COUNT,
        "registers_per_block": _COUNT,
        "l2_cache_size_bytes": _BYTES,
        "max_function_args": _COUNT,
    },
}

#: What a file's whole target string may hold (checked before it is split).
_PRINTABLE = re.compile(r"[ -~]{1,1024}\Z")


def target_problem(text: object) -> str | None:
    """Why ``text`` is not a target a file may carry, or None."""
    if not isinstance(text, str) or not _PRINTABLE.match(text):
        return "its target is not a short line of plain text"
    kind, *options = text.split()
    allowed = ALLOWED.get(kind)
    if allowed is None:
        return f"its target kind {kind[:40]!r} is not one relay-tasks tunes for ({_kinds()})"
    for option in options:
        name, equals, value = option.partition("=")
        name = name[1:] if name.startswith("-") else ""
        check = allowed.get(name)
        if check is None:
            shown = option.split("=")[0][:40]
            return (f"its target sets {shown!r}, which a file may not set for {kind} "
                    f"(allowed: {', '.join('-' + n for n in sorted(allowed))})")  # fmt: skip
        if not equals or not check(value):
            return f"its target's -{name} is {value[:40]!r}, not a plain value of that attribute"
    return None


def _kinds() -> str:
    return ", ".join(sorted(ALLOWED))
