"""The test model zoo: built-in networks plus the small graphs, built once per session.

Rows name a model and carry its pytest marks, so every table-driven test runs the same zoo and
the slow networks are selected with ``-m slow`` (or ``-m ''`` for everything).
"""

from __future__ import annotations

import functools

import pytest
import tvm

from relay_tasks.inputs import host_target
from relay_tasks.ir import with_functions
from relay_tasks.loaders.zoo import load_zoo_model

from small_graphs import SMALL_GRAPHS

#: Extraction targets (fixed, so rows compare the same tasks on every machine); code that a test
#: executes is built for HOST, this machine's CPU: an AVX2-only CPU cannot run skylake-avx512's.
X86 = "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"
HOST = str(host_target())
CUDA = "cuda -arch=sm_80"
AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mattr=+neon"
TARGETS = {"x86": X86, "cuda": CUDA}

#: Networks from tvm.relay.testing; only ResNet-18 runs by default.
NETWORKS = {
    "resnet-18": (),
    "resnet-50": (pytest.mark.slow,),
    "mobilenet": (pytest.mark.slow,),
    "vgg-16": (pytest.mark.slow,),
}
SMALL = list(SMALL_GRAPHS)
#: (network, target) rows in the slow tier though the network runs by default: ResNet-18's
#: CUDA rows cost a minute of the default run's wall time, its x86 rows stay.
SLOW_ROWS = {("resnet-18", "cuda")}


def model_rows(*, small: bool = True, networks: bool = True) -> list[pytest.param]:
    rows = []
    if small:
        rows += [pytest.param(name, id=name) for name in SMALL]
    if networks:
        rows += [pytest.param(name, marks=marks, id=name) for name, marks in NETWORKS.items()]
    return rows


def model_target_rows(**which: bool) -> list[pytest.param]:
    """(model, target) rows; rows of one model and target share an xdist worker (and its
    cached upstream oracles)."""
    rows = []
    for row in model_rows(**which):
        name = row.values[0]
        for tname, target in TARGETS.items():
            marks = (*row.marks, pytest.mark.xdist_group(f"{name}-{tname}"))
            if (name, tname) in SLOW_ROWS:
                marks = (*marks, pytest.mark.slow)
            rows.append(pytest.param(name, target, marks=marks, id=f"{name}-{tname}"))
    return rows


@functools.cache
def _build(name: str) -> tuple[tvm.IRModule, dict[str, tvm.nd.NDArray]]:
    if name in SMALL_GRAPHS:
        return SMALL_GRAPHS[name]()
    return load_zoo_model(name)


def load(name: str) -> tuple[tvm.IRModule, dict[str, tvm.nd.NDArray]]:
    """A private copy of a zoo model: upstream's extractors bind params into the module they get."""
    mod, params = _build(name)
    return copy_module(mod), params


def copy_module(mod: tvm.IRModule) -> tvm.IRModule:
    """A new module object with the same content, Prelude type definitions included."""
    return with_functions(mod, {})
