"""3x3 stride-1 convolutions become NHWC Winograd convolutions computing the same (ResNet-18's
direct ones already run at the FMA limit, so only fewer multiplies make them faster); every
other convolution stays as it was, and the CLI tunes and compiles the rewritten model while it
times the model as loaded against it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import meta_schedule as ms
from tvm import relay
from tvm.contrib import graph_executor

import relay_tasks
from relay_tasks.adapters.untuned import WINOGRAD
from relay_tasks.cli import main
from relay_tasks.loaders.winograd import _calls_of, winograd_convolutions

from checks import ops_called

RNG = np.random.default_rng(5)


def _weight(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def _run(mod: tvm.IRModule, params: dict[str, Any], x: np.ndarray, *, meta: bool) -> np.ndarray:
    """The model's output on this CPU; ``meta`` builds as MetaSchedule's compile does (with no
    record, TOPI's default schedules), which Winograd convolutions need, the rest unoptimised
    (x86's layout alteration refuses a convolution without channels and kernel size)."""
    config = {"relay.backend.use_meta_schedule": True} if meta else {}
    level = 3 if meta else 0
    with ms.database.MemoryDatabase(), tvm.transform.PassContext(level, config=config):
        lib = relay.build(mod, target=relay_tasks.host_target(), params=params)
    graph = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    graph.set_input("x", x)
    graph.run()
    return graph.get_output(0).numpy()


def _mixed() -> tuple[tvm.IRModule, dict[str, Any]]:
    """Two convolutions that fit (the first, its kernel a param; the fifth, a constant with
    uneven padding) among four that do not: stride 2, 1x1, grouped, dilated. Taken in the
    wrong order, the convolutions asked to stay would be the second and the sixth."""
    x = relay.var("x", shape=(1, 8, 12, 12))
    w = relay.var("w", shape=(16, 8, 3, 3))
    y = relay.nn.relu(relay.nn.conv2d(x, w, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    y = relay.nn.max_pool2d(y, pool_size=(3, 3), padding=(1, 1))  # ConvertLayout warns of it
    y = relay.nn.conv2d(y, relay.const(_weight(16, 16, 3, 3)), strides=(2, 2), padding=(1, 1))
    y = relay.nn.conv2d(y, relay.const(_weight(12, 16, 1, 1)), kernel_size=(1, 1))
    y = relay.nn.conv2d(y, relay.const(_weight(12, 3, 3, 3)), padding=(1, 1), groups=4)
    y = relay.nn.conv2d(y, relay.const(_weight(20, 12, 3, 3)), padding=(0, 1, 2, 1))
    y = relay.nn.conv2d(y, relay.const(_weight(12, 20, 3, 3)), padding=(2, 2), dilation=(2, 2))
    y = relay.add(y, relay.const(_weight(12, 1, 1)))
    params = {"w": tvm.nd.array(_weight(16, 8, 3, 3))}
    return tvm.IRModule.from_expr(relay.Function([x, w], y)), params


def test_convolutions_that_fit_become_winograd_ones_and_compute_the_same(capfd) -> None:
    mod, params = _mixed()
    x = RNG.standard_normal((1, 8, 12, 12)).astype("float32")
    expected = _run(mod, params, x, meta=False)
    capfd.readouterr()
    rewritten, left = winograd_convolutions(mod, params)
    assert capfd.readouterr() == ("", "")  # not ConvertLayout's warning per operator
    called = ops_called(rewritten)
    assert called.count(WINOGRAD) == 2 and called.count("nn.conv2d") == 4
    assert called.index(WINOGRAD) < called.index("nn.conv2d")  # the first convolution
    assert left == {}  # the param kernel was taken in, transformed
    got = _run(rewritten, left, x, meta=True)  # six convolutions deep, |y| in the thousands
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def _nhwc(height: int, width: int, kernel: tuple[int, int] = (3, 3)) -> tvm.IRModule:
    x = relay.var("x", shape=(1, height, width, 6))
    k = relay.const(_weight(*kernel, 6, 10))
    conv = relay.nn.conv2d(x, k, padding=(1, 1), data_layout="NHWC", kernel_layout="HWIO")
    return tvm.IRModule.from_expr(relay.Function([x], conv))


@pytest.mark.parametrize("size", [(7, 9), (6, 10), (1, 1)])
def test_nhwc_convolutions_fit_as_they_are(size: tuple[int, int]) -> None:
    """TFLite's models come in NHWC with HWIO kernels; tiles run past uneven sizes."""
    mod = _nhwc(*size)
    data = RNG.standard_normal((1, *size, 6)).astype("float32")
    rewritten, _ = winograd_convolutions(mod, {})
    assert ops_called(rewritten) == [WINOGRAD]
    got = _run(rewritten, {}, data, meta=True)
    np.testing.assert_allclose(got, _run(mod, {}, data, meta=False), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("size", [(9, 7), (8, 7), (40, 2)])
def test_sizes_topi_pads_too_little_for_and_other_kernels_are_left_whole(
    size: tuple[int, int],
) -> None:
    """TOPI's NHWC Winograd pads the bottom and the right by one amount, from the tiles
    across and the height: with more tiles down than across, the last rows read past the data
    (9x7: rows 7 and 8 came out as 1e37); at 8x7 the last tiles would read a column past."""
    for mod in (_nhwc(*size), _nhwc(8, 8, kernel=(1, 1)), _nhwc(8, 8, kernel=(5, 5))):
        assert winograd_convolutions(mod, {})[0] is mod


@pytest.mark.parametrize(
    ("size", "winograd"), [((7, 7), False), ((14, 14), False), ((28, 28), True)]
)
def test_a_large_kernel_read_for_few_tiles_stays_direct(size: tuple[int, int], winograd: bool):
    """ResNet's last stage: 512 channels at 7x7 are 4 tiles of a 38 MB transformed kernel,
    each weight used 4 times (the direct one's 49); at 14x14 (16 tiles) it still does not pay
    in the model; at 28x28 (49 tiles) it does."""
    x = relay.var("x", shape=(1, 512, *size))
    conv = relay.nn.conv2d(x, relay.const(_weight(512, 512, 3, 3)), padding=(1, 1))
    mod = tvm.IRModule.from_expr(relay.Function([x], conv))
    rewritten, _ = winograd_convolutions(mod, {})
    assert (WINOGRAD in ops_called(rewritten)) is winograd


@pytest.mark.parametrize("tuner", ["meta_schedule", "ansor"])
def test_both_tuners_that_schedule_winograd_extract_it(tuner: str) -> None:
    mod, params = winograd_convolutions(*_mixed())
    tasks = relay_tasks.extract(mod, relay_tasks.host_target(), params, tuner=tuner)
    assert sum("winograd" in t.name for t in tasks) == 2


def _conv_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["y"], ["out"])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16, 12, 12])],
        [numpy_helper.from_array(_weight(16, 8, 3, 3), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_cli_tunes_and_compiles_winograd_and_times_it_against_the_model_as_loaded(
    tmp_path, capsys
) -> None:
    """The untuned build it is timed against is the model as loaded (TOPI has no default
    schedule of Winograd convolutions to time), and the outputs agree."""
    model, work = str(_conv_onnx(tmp_path / "conv.onnx")), str(tmp_path / "work")
    assert main(["extract", model, "--winograd", "--format", "json"]) == 0
    assert '"fused_nn_contrib_conv2d_winograd_without_weight_transform' in capsys.readouterr().out
    assert main(["tune", model, "--winograd", "--trials", "3", "--work-dir", work]) == 0
    capsys.readouterr()
    argv = ["compile", model, "--work-dir", work, "-o", str(tmp_path / "m.so"), "--benchmark"]
    assert main([*argv, "--winograd"]) == 0
    out = capsys.readouterr().out.splitlines()
    # The convolution and the layout transforms into NHWC and back (fused with the ReLU);
    # or, where no Winograd record was used (3 measurements), the convolution built direct.
    tuned = re.fullmatch(
        rf"{model}: [0-3]/[1-3] tasks tuned, library in {tmp_path / 'm.so'}", out[0]
    )
    assert tuned, out[0]
    found = re.search(r"outputs differ by at most ([0-9.e-]+)$", out[1])
    assert found and float(found.group(1)) < 1e-3, out[1]
    # Without the flag the model's task is the direct convolution, which the records miss.
    assert main(argv) == 2
    assert ("its records are of Winograd convolutions: give --winograd, as to tune; or tune "
            in capsys.readouterr().err)  # fmt: skip


def test_winograd_is_refused_for_autotvm_and_untuned_builds_in_one_line(tmp_path, capsys) -> None:
    model = str(_conv_onnx(tmp_path / "conv.onnx"))
    assert main(["extract", model, "--winograd", "--tuner", "autotvm"]) == 2
    assert capsys.readouterr().err == (
        "relay-tasks: error: --winograd applies to --tuner meta_schedule or ansor: TVM schedules "
        "Winograd convolutions on CPUs for them only, not for autotvm\n"
    )
    output = tmp_path / "m.so"
    argv = ["compile", model, "--work-dir", str(tmp_path), "-o", str(output), "--untuned"]
    assert main([*argv, "--winograd"]) == 2
    assert capsys.readouterr().err == (
        "relay-tasks: error: --untuned builds with TVM's default schedules, and TOPI has none for "
        "Winograd convolutions (they would run unscheduled): drop --winograd\n"
    )
    assert not output.exists()


def test_a_build_names_the_winograd_calls_no_record_covers_and_those_can_stay_direct(
    tmp_path,
) -> None:
    """Unrecorded, a Winograd call is lowered with the tuner's naive schedule (x86 has no
    other), and the build names its signature; the rewrite then leaves the convolutions of
    those signatures direct, and the model still computes what it did."""
    from relay_tasks.adapters.meta_schedule import library
    from relay_tasks.adapters.untuned import naive_calls, signature

    mod, params = _mixed()
    x = RNG.standard_normal((1, 8, 12, 12)).astype("float32")
    expected = _run(mod, params, x, meta=False)
    rewritten, left = winograd_convolutions(mod, params)
    calls = [signature(c) for c in _calls_of(rewritten["main"], WINOGRAD)]
    target = relay_tasks.host_target()
    tasks = relay_tasks.extract(rewritten, target, left, tuner="meta_schedule")
    with naive_calls() as naive:
        built = library.build(rewritten, target, left, tmp_path, [], tasks)
    assert naive == set(calls) and len(naive) == 2
    for factory, model_params in ((built, left), (None, None)):
        if factory is None:  # the first convolution direct, the fifth still Winograd
            direct, model_params = winograd_convolutions(mod, params, direct={calls[0]})
            assert [signature(c) for c in _calls_of(direct["main"], WINOGRAD)] == calls[1:]
            assert ops_called(direct).count("nn.conv2d") == 5
            with naive_calls() as naive:
                factory = library.build(direct, target, model_params, tmp_path, [], tasks)
            assert naive == {calls[1]}
        graph = graph_executor.GraphModule(factory["default"](tvm.cpu()))
        graph.set_input("x", x)
        graph.run()
        got = graph.get_output(0).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_a_kernel_whose_transform_passes_the_constant_limit_stays_direct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """6 in and 10 out channels: 2,160 bytes of kernel, 17,280 transformed in float64."""
    mod = _nhwc(8, 8)
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANT_BYTES", "17279")
    assert winograd_convolutions(mod, {})[0] is mod
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANT_BYTES", "17280")
    assert ops_called(winograd_convolutions(mod, {})[0]) == [WINOGRAD]
