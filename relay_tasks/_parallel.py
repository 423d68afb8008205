"""TVM-compiled code on every core: hhb-tvm's runtime runs each parallel loop on one thread.

A library TVM compiles calls ``TVMBackendParallelLaunch`` through a pointer that libtvm fills
when it loads the library, with the definition libtvm's own relocation found when libtvm itself
was loaded: the first in the process's global scope. hhb-tvm 3.2.3 defines it to start an OpenMP
region of one thread whatever ``TVM_NUM_THREADS`` says, so every operator (tuned or not, in a
measurement or a deployed build) used one core: ResNet-18 ran 33.4 ms on this two-core host and
runs 17.5 ms on both. ``parallel_launch.c`` defines the launch (and its barrier) on a team of
threads of its own, whose wait between loops adapts to how busy the machine is; loaded with
``RTLD_GLOBAL`` before libtvm, it is the definition libtvm hands out. Child processes (TVM's
measuring pool, which imports tvm before anything of ours) get it through ``LD_PRELOAD``,
which :func:`install` extends for every process this one starts.

The library is built once per source with the C compiler TVM's own ``export_library`` needs,
into a cache directory only this user can write (a directory others can write could hold a
planted library; then it is built afresh in a private temporary directory instead).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

#: The C source of the launch, shipped beside this module.
SOURCE = Path(__file__).with_name("parallel_launch.c")

#: How long a thread of the OpenMP runtimes that others load into the process waits busy before
#: it sleeps (libgomp's ``GOMP_SPINCOUNT``, default 300,000): XGBoost's, in MetaSchedule's cost
#: model, beside the tune's builds and measurements. TVM-compiled loops no longer run on OpenMP.
SPINS = 1000

#: The symbol whose definition decides how many threads TVM-compiled loops use.
LAUNCH = "TVMBackendParallelLaunch"


@functools.cache
def install() -> Path | None:
    """Make TVM-compiled code in this process and its children run on every core; the library
    that does it, or None where it cannot act (tvm already loaded, no C compiler: then a
    warning says so, once, and code runs as hhb-tvm runs it, on one core)."""
    os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))
    os.environ.setdefault("GOMP_SPINCOUNT", str(SPINS))
    preloaded = _preloaded()
    if preloaded is not None:
        return preloaded
    if "tvm" in sys.modules:
        return None  # libtvm resolved its launch already; ours would only reach the children
    try:
        library = _library()
    except (OSError, subprocess.SubprocessError) as error:
        from .errors import RelayTasksWarning, warn

        warn(
            f"could not build relay-tasks' parallel launch ({error}); TVM-compiled code runs "
            "on one core, as hhb-tvm's runtime runs it: install gcc to use every core",
            RelayTasksWarning,
        )
        return None
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    preload = os.environ.get("LD_PRELOAD", "")
    os.environ["LD_PRELOAD"] = f"{library} {preload}".strip()
    return library


def active() -> bool:
    """Whether TVM-compiled code in this process launches its loops through ours."""
    library = _preloaded()
    if library is None:
        return False
    ours = ctypes.cast(getattr(ctypes.CDLL(str(library)), LAUNCH), ctypes.c_void_p).value
    found = ctypes.cast(getattr(ctypes.CDLL(None), LAUNCH), ctypes.c_void_p).value
    return ours is not None and ours == found


def physical_cores() -> int:
    """The cores this process may run on, two hyperthreads of one core counted once (what
    TVM's runtime counts; compute-bound loops gain nothing from a core's second thread)."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            package, core = "cpu", str(cpu)
        cores.add((package, core))
    return max(1, len(cores))


def _preloaded() -> Path | None:
    """Our library, where this process already has it (named in LD_PRELOAD)."""
    for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if Path(entry).name.startswith("relay-tasks-parallel-") and entry in _loaded():
            return Path(entry)
    return None


def _loaded() -> str:
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def _library() -> Path:
    """The built launch: from the cache where this user alone can write it, else built."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + platform.machine().encode()).hexdigest()[:16]
    name = f"relay-tasks-parallel-{digest}.so"
    cache = _private_dir(_cache_root())
    if cache is not None and " " not in str(cache) and ":" not in str(cache):
        built = cache / name
        if _private_file(built):
            return built
        return _build(cache, built)
    scratch = Path(tempfile.mkdtemp(prefix="relay-tasks-parallel-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return _build(scratch, scratch / name)


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "relay-tasks"


def _private_dir(folder: Path) -> Path | None:
    """``folder``, made if missing, where no other user can write it or swap a parent of it
    (a parent others may write is safe only with the sticky bit, as /tmp has)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None
        for parent in folder.parents:
            info = parent.stat()
            shared = info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX
            if info.st_uid not in (0, os.geteuid()) or shared:
                return None
    except OSError:
        return None
    return folder


def _private_file(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    mode = info.st_mode
    return stat.S_ISREG(mode) and info.st_uid == os.geteuid() and not mode & 0o022


def _build(folder: Path, built: Path) -> Path:
    """Compile the source into ``built``, through a file of its own renamed into place (two
    processes building at once each rename a whole library)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise OSError("no C compiler (gcc or cc) on PATH")
    handle, partial = tempfile.mkstemp(dir=folder, suffix=".so")
    os.close(handle)
    try:
        command = [compiler, "-O2", "-fPIC", "-shared", "-pthread", str(SOURCE), "-o", partial]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{Path(compiler).name} failed: {done.stderr.strip()[-300:]}")
        os.chmod(partial, 0o755)
        os.replace(partial, built)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return built


install()
