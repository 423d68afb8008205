"""Upstream's own extractors, called exactly as a user would, cached per session.

These are the references every equality test compares with. Each call gets a private copy of the
model (see ``zoo.load``) because upstream binds params into the module it is given.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
from tvm import meta_schedule as ms
from tvm import relay
from tvm.meta_schedule.database import PyDatabase
from tvm.meta_schedule.utils import derived_object

from zoo import load


@functools.cache
def meta_schedule(model: str, target: str, module_equality: str = "structural") -> list:
    """``tvm.meta_schedule.relay_integration.extract_tasks`` (the C++ ExtractTask)."""
    mod, params = load(model)
    return list(
        ms.relay_integration.extract_tasks(
            mod, tvm.target.Target(target), params, module_equality=module_equality
        )
    )


@dataclass(frozen=True)
class LoweredQuery:
    name: str
    mod: tvm.IRModule


@derived_object
class _RecordingDatabase(PyDatabase):
    """Records every workload the compiler asks MetaSchedule for; never has a record."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[LoweredQuery] = []

    def has_workload(self, mod):
        return False

    def commit_workload(self, mod):
        return ms.database.Workload(mod)

    def commit_tuning_record(self, record):
        return None

    def get_top_k(self, workload, top_k):
        return []

    def get_all_tuning_records(self):
        return []

    def query_tuning_record(self, mod, target, workload_name):
        self.queries.append(LoweredQuery(str(workload_name), mod))
        return None

    def __len__(self):
        return 0


@functools.cache
def legacy_vm_lowering(model: str, target: str) -> list[LoweredQuery]:
    """What a real ``relay.vm.VMCompiler().lower`` converts to TIR with MetaSchedule on.

    With ``relay.backend.use_meta_schedule`` the compiler's TE compiler turns every primitive
    function it lowers into TIR with the TIR converter and queries the current database with it;
    the queries made while lowering ``main`` (named ``vm_mod_*``) are the functions compiled.
    """
    mod, params = load(model)
    tgt = tvm.target.Target(target)
    database = _RecordingDatabase()
    config = {"relay.backend.use_meta_schedule": True, "relay.backend.tir_converter": "default"}
    with tgt, database, tvm.transform.PassContext(opt_level=3, config=config):
        compiler = relay.vm.VMCompiler()
        compiler.set_params(params)
        compiler.lower(mod, target=tgt)
    return [q for q in database.queries if q.name.startswith("vm_mod_")]
