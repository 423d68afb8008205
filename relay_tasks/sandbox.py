"""Reading untrusted files in a confined child: the next bug in a converter or in TVM is harmless.

Converting a model file runs a lot of code we do not own (TVM's frontends, onnx, torch's
TorchScript reader, flatbuffers) on bytes an attacker may have chosen. That code runs in a
forked child that, before it reads anything:

- may write only inside a private scratch folder (Landlock: every other write, removal or new
  file is refused by the kernel), and may not reach the network (no network namespace of the
  host, where the kernel lets it make its own; Landlock refuses TCP binds and connects, and
  signals and abstract sockets outside the child);
- has an address-space limit (``RLIMIT_AS``) and a CPU-time limit (``RLIMIT_CPU``), and no core
  dumps;
- hands back data only: a converted model as Relay text and the bytes of a params file, which
  the parent reads as it reads a Relay text file and a params file (constants only in the
  metadata, every array's size checked before it is allocated).

Landlock is unprivileged and in Linux since 5.13; where the kernel lacks it (or an ABI a rule
needs), what is not enforced is said once, in one line. The limits are settable through the
environment variables :data:`MEMORY` and :data:`SECONDS` name.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import mmap
import os
import resource
import select
import signal
import site
import struct
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from . import errors
from .errors import ModelError, RelayTasksError, UsageError
from .files import write_all
from .scratch import scratch_dir

#: The address space a child may take, and how many CPU seconds it may use.
MEMORY = "RELAY_TASKS_SANDBOX_MEMORY"
SECONDS = "RELAY_TASKS_SANDBOX_SECONDS"
_DEFAULT_SECONDS = 900


def memory_limit() -> int:
    """Bytes of address space: :data:`MEMORY`, else half the machine's memory (at least
    8 GiB: torch and LLVM reserve several GiB of address space they never touch)."""
    text = os.environ.get(MEMORY, "")
    if text:
        if not text.isdigit():
            raise UsageError(f"{MEMORY}={text!r} is not a number of bytes")
        return int(text)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(physical // 2, 8 << 30)


def cpu_limit() -> int:
    text = os.environ.get(SECONDS, "")
    if text:
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"{SECONDS}={text!r} is not a number of seconds")
        return int(text)
    return _DEFAULT_SECONDS


# Landlock (linux/landlock.h): its system calls, the rights a ruleset handles, and the flags.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
#: Rights to change the file system, by the ABI that introduced them (bits 1, 4-12, 13, 14, 15).
_WRITES = {1: sum(1 << bit for bit in (1, *range(4, 13))), 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}
#: The rights on a file (not a folder) among those: write, truncate, ioctl on a device.
_FILE_WRITES = (1 << 1) | (1 << 14) | (1 << 15)
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI 4)
_SCOPED = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_LIBC = ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 without Landlock)."""
    abi = int(_LIBC.syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION))
    return max(abi, 0)


def confine(scratch: Path) -> list[str]:
    """Confine this process (a fresh child, one thread) to writing inside ``scratch``, with no
    network and the limits; returns what the kernel could not enforce, in words."""
    missing: list[str] = []
    memory, seconds = memory_limit(), cpu_limit()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = str(scratch)
    sys.dont_write_bytecode = True
    # What ``python -I`` leaves off the import path: the current folder (a model's folder may
    # hold a ``torch.py``) and the user's site-packages; converters import lazily, from here on.
    user_site = site.getusersitepackages()
    here = {"", ".", os.getcwd()}
    sys.path[:] = [p for p in sys.path if p not in here and not p.startswith(user_site)]
    if _LIBC.unshare(_CLONE_NEWNET) != 0 and _LIBC.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        missing.append("a network namespace of its own")
    abi = landlock_abi()
    if abi < 1:
        return [*missing, "Landlock (writes outside its scratch folder are not refused)"]
    handled = sum(bits for since, bits in _WRITES.items() if abi >= since)
    attr = _RulesetAttr(handled, _NET_TCP if abi >= 4 else 0, _SCOPED if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = int(_LIBC.syscall(_CREATE_RULESET, ctypes.byref(attr), size, 0))
    if ruleset < 0:
        return [*missing, f"Landlock ({os.strerror(ctypes.get_errno())})"]
    try:
        _allow(ruleset, scratch, handled)
        _allow(ruleset, Path(os.devnull), handled & _FILE_WRITES)
        if (
            _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or _LIBC.syscall(_RESTRICT_SELF, ruleset, 0) != 0
        ):
            return [*missing, f"Landlock ({os.strerror(ctypes.get_errno())})"]
    finally:
        os.close(ruleset)
    if abi < 4:
        missing.append("Landlock's TCP rules (kernel ABI 4)")
    if abi < 6:
        missing.append("Landlock's signal and socket scopes (kernel ABI 6)")
    return missing


def _allow(ruleset: int, path: Path, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(rights, fd)
        if _LIBC.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"Landlock refused a rule for {path}")
    finally:
        os.close(fd)


#: Errors a child may report, by name: anything else it reports is a ModelError.
_ERRORS = {
    cls.__name__: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, RelayTasksError) and cls is not RelayTasksError
}
_WARNINGS = {
    cls.__name__: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.RelayTasksWarning)
}
_told: set[str] = set()


#: What a child's work returns: pieces of bytes, sent one after the other.
Pieces = Sequence[bytes | memoryview]


def run_confined(work: Callable[[], Pieces], what: str) -> memoryview:
    """``work()`` run in a confined, forked child (:func:`confine`); its bytes, or its error
    raised here (an error class of ours, with its message), or a ``ModelError`` saying how the
    child died. ``what`` names the input in those messages ("reading model.onnx").

    The child writes its answer into an anonymous memory file and the parent maps it (a
    100 MB answer took 0.31 s through a pipe); the pipe only tells when the child is done."""
    with scratch_dir("sandbox") as scratch:
        answer = os.memfd_create("relay-tasks-answer", os.MFD_CLOEXEC)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child; its outcome is what the tests check)
            os.close(reader)
            _child(work, scratch, answer)
        os.close(writer)
        try:
            _wait_for_eof(reader, pid, cpu_limit() * 2 + 60)
            _, status = os.waitpid(pid, 0)
            size = os.fstat(answer).st_size
            data = mmap.mmap(answer, size, prot=mmap.PROT_READ) if size else b""
        finally:
            os.close(reader)
            os.close(answer)
    return _outcome(memoryview(data), status, what)


def _child(work: Callable[[], Pieces], scratch: Path, answer: int) -> None:  # pragma: no cover
    """Confine, work, and write ``header + result`` into ``answer``; never returns."""
    code = 0
    faulthandler.disable()  # a crash here is the parent's to report, in one line
    try:
        header: dict[str, object] = {"missing": confine(scratch)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result: Pieces = ()
            try:
                result = work()
            except RelayTasksError as err:
                header["error"] = [type(err).__name__, str(err)]
            except MemoryError:
                header["error"] = ["MemoryError", ""]
        header["warnings"] = [
            [w.category.__name__, str(w.message)]
            for w in caught
            if issubclass(w.category, errors.RelayTasksWarning)
        ]
        text = json.dumps(header).encode()
        for piece in (struct.pack("<Q", len(text)), text, *result):
            write_all(answer, piece)
    except BaseException:  # the child's end: anything else is an exit code
        code = 70
    finally:
        os._exit(code)


def _wait_for_eof(fd: int, pid: int, seconds: float) -> None:
    """Wait until the child closes its end of the pipe (it exits), at most ``seconds``."""
    ready, _, _ = select.select([fd], [], [], seconds)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise ModelError(f"gave up after {seconds:g} s without an answer")
    os.read(fd, 1)


def _outcome(data: memoryview, status: int, what: str) -> memoryview:
    if os.WIFSIGNALED(status) or len(data) < 8:
        raise ModelError(f"{what}: {_death(status)}")
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(bytes(data[8 : 8 + size]))
    for missing in header.get("missing", []):
        if missing not in _told:
            _told.add(missing)
            print(f"relay-tasks: the sandbox that reads model files runs without {missing} "
                  "on this kernel", file=sys.stderr)  # fmt: skip
    for category, message in header.get("warnings", []):
        errors.warn(message, _WARNINGS.get(category, errors.RelayTasksWarning))
    error = header.get("error")
    if error is not None:
        name, message = error
        if name == "MemoryError":
            raise ModelError(f"{what}: ran out of its {memory_limit() / 2**30:.1f} GiB of memory; "
                             f"raise {MEMORY}=BYTES if the model is that large")  # fmt: skip
        raise _ERRORS.get(name, ModelError)(message)
    return data[8 + size :]


def _death(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number in (signal.SIGXCPU, signal.SIGKILL):
            return (f"used up its {cpu_limit()} s of CPU time (or was killed); raise "
                    f"{SECONDS}=SECONDS if the model takes that long")  # fmt: skip
        return (f"crashed the converter ({signal.Signals(number).name}), possibly at its "
                f"{memory_limit() / 2**30:.1f} GiB memory limit ({MEMORY}); it is not a "
                "file relay-tasks can read")  # fmt: skip
    return f"the converter ended with exit code {os.WEXITSTATUS(status)} and no answer"


__all__ = ["confine", "cpu_limit", "landlock_abi", "memory_limit", "run_confined"]
