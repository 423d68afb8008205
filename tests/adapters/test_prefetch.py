from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, tir

import relay_tasks
from relay_tasks.adapters.meta_schedule import library
from relay_tasks.adapters.meta_schedule.prefetch import LINE_BYTES, prefetch_weights

ROWS, UNITS, DEPTH = 64, 1024, 512
PANEL, ROW_BLOCK = 32, 8


def _dense(chunk: int, layout_free: bool = True) -> tvm.IRModule:
    """A dense layer scheduled as MetaSchedule schedules one: its weight rewritten to the order
    the kernel reads it, a ``PANEL``-wide panel per parallel turn, ``chunk`` of the reduction a
    turn of ``k0``, and each such chunk reused by the ``ROW_BLOCK`` turns of ``i0`` inside."""
    data = te.placeholder((ROWS, DEPTH), name="data")
    weight = te.placeholder((UNITS, DEPTH), name="weight")
    k = te.reduce_axis((0, DEPTH), name="k")
    out = te.compute((ROWS, UNITS), lambda i, j: te.sum(data[i, k] * weight[j, k], axis=k))
    func = te.create_prim_func([data, weight, out])
    if layout_free:
        func = func.with_attr("layout_free_buffers", [1])
    sch = tir.Schedule(func)
    block = sch.get_block("compute")
    i, j, k = sch.get_loops(block)
    j0, j1 = sch.split(j, [None, PANEL])
    k0, k1 = sch.split(k, [None, chunk])
    i0, i1 = sch.split(i, [None, ROW_BLOCK])
    sch.reorder(j0, k0, i0, k1, i1, j1)
    sch.parallel(j0)
    sch.transform_layout(block, ("read", 1), lambda j, k: (j // PANEL, k // chunk, k % chunk, j % PANEL))  # fmt: skip
    return sch.mod


def _built(mod: tvm.IRModule, prefetch: bool) -> tuple[tvm.runtime.Module, str]:
    passes = [(1, prefetch_weights())] if prefetch else []
    with tvm.transform.PassContext(config={"tir.add_lower_pass": passes}):
        text = tvm.lower(mod).script()
        return tvm.build(mod, target=relay_tasks.host_target()), text


def _run(lib: tvm.runtime.Module, mod: tvm.IRModule) -> np.ndarray:
    func = mod["main"]
    shapes = [[int(d) for d in func.buffer_map[p].shape] for p in func.params]
    rng = np.random.default_rng(0)
    args = [tvm.nd.array(rng.standard_normal(s).astype("float32")) for s in shapes[:2]]
    out = tvm.nd.empty(shapes[2], "float32")
    lib(*args, out)
    return out.numpy()


def test_the_next_chunk_of_a_reused_weight_is_prefetched_a_share_a_turn() -> None:
    """Each turn of ``i0`` prefetches its share of the next ``k0`` chunk's lines; nothing else
    changes: the results are the same to the bit."""
    chunk = 64
    mod = _dense(chunk)
    plain, plain_text = _built(mod, prefetch=False)
    hinted, text = _built(mod, prefetch=True)
    assert "T.prefetch" not in plain_text
    lines = chunk * PANEL * 4 // LINE_BYTES  # the chunk's cache lines
    share = lines // ROW_BLOCK
    assert text.count("T.prefetch(") == 1 and f"for line in range({share}):" in text
    per_line, step = LINE_BYTES // 4, chunk * PANEL  # floats: a line's, a turn of k0's
    assert (
        f"[T.min(j_0 * {step * DEPTH // chunk} + k_0 * {step} + i_0 * {share * per_line} + line "
        f"* {per_line} + {step}, {UNITS * DEPTH - 1})]" in text
    )  # the next chunk, this turn's share of it, clamped to the weight's last element
    np.testing.assert_array_equal(_run(hinted, mod), _run(plain, mod))


@pytest.mark.parametrize(
    ("mod", "why"),
    [
        (_dense(64, layout_free=False), "a weight the function does not call layout-free"),
        (_dense(16), "a chunk under 4 KB (16 x 32 floats)"),
    ],
)
def test_no_prefetch_where_it_does_not_pay(mod: tvm.IRModule, why: str) -> None:
    assert "T.prefetch" not in _built(mod, prefetch=True)[1], why


def test_cpu_builds_prefetch_and_gpu_builds_do_not() -> None:
    passes = library.pass_config(relay_tasks.host_target())["tir.add_lower_pass"]
    assert [(phase, p.info.name) for phase, p in passes] == [(1, "relay_tasks.PrefetchWeights")]
    assert "tir.add_lower_pass" not in library.pass_config(tvm.target.Target("cuda"))


def test_a_metaschedule_build_lowers_with_it(tmp_path, monkeypatch) -> None:
    from tvm import relay

    from relay_tasks.adapters import get_adapter

    asked: list[dict] = []
    real = library.ms.relay_integration.compile_relay

    def compile_relay(*args, **kwargs):
        asked.append(kwargs["pass_config"])
        return real(*args, **kwargs)

    monkeypatch.setattr(library.ms.relay_integration, "compile_relay", compile_relay)
    data, weight = relay.var("data", shape=(8, 64)), relay.var("weight", shape=(32, 64))
    mod = tvm.IRModule.from_expr(relay.Function([data, weight], relay.nn.dense(data, weight)))
    adapter, target = get_adapter("meta_schedule"), relay_tasks.host_target()
    adapter.build(mod, target, {}, tmp_path, [], adapter.extract(mod, target, {}))
    [config] = asked
    assert [p.info.name for _, p in config["tir.add_lower_pass"]] == ["relay_tasks.PrefetchWeights"]
    assert config["relay.backend.use_meta_schedule"] is True
