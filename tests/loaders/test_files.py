"""Loading model files: ONNX, TFLite, Relay text and the zoo, with clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import meta_schedule as ms
from tvm import relay

from relay_tasks import ModelError, UsageError
from relay_tasks.loaders import load_model, parse_shapes
from relay_tasks.meta_schedule import extract_task_from_relay

from checks import assert_same_extracted_tasks
from tflite_writer import fully_connected_model
from zoo import X86


def _onnx_conv(path: Path, batch: int | str = 1, op: str = "Relu") -> Path:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "W")
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node(op, ["y"], ["z"])
        if op == "Relu"
        else helper.make_node(op, ["y"], ["z"], domain="custom.ops"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 8, 16, 16])],
        [weight],
    )
    opsets = [helper.make_opsetid("", 13)] + (
        [helper.make_opsetid("custom.ops", 1)] if op != "Relu" else []
    )
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def test_onnx_model_gives_upstreams_tasks(tmp_path: Path) -> None:
    path = _onnx_conv(tmp_path / "conv.onnx")
    mod, params = load_model(path)
    reference, reference_params = relay.frontend.from_onnx(onnx.load(str(path)), freeze_params=True)
    expected = ms.relay_integration.extract_tasks(
        reference, tvm.target.Target(X86), reference_params
    )
    assert expected, "the ONNX model gave upstream no task; the comparison would prove nothing"
    assert_same_extracted_tasks(list(expected), extract_task_from_relay(mod, X86, params))


def test_onnx_dynamic_dimension_needs_a_shape(tmp_path: Path) -> None:
    path = _onnx_conv(tmp_path / "dynamic.onnx", batch="N")
    with pytest.raises(
        ModelError,
        match=r"input 'x' has a dynamic dimension \('N'\); give its shape with --input-shapes 'x:\[...\]'",
    ):
        load_model(path)
    mod, _ = load_model(path, shapes={"x": [2, 3, 16, 16]})
    assert [int(d) for d in mod["main"].params[0].checked_type.shape] == [2, 3, 16, 16]
    with pytest.raises(ModelError, match="no input named y; the inputs are x"):
        load_model(path, shapes={"x": [2, 3, 16, 16], "y": [1]})


def test_onnx_with_an_unsupported_op(tmp_path: Path) -> None:
    path = _onnx_conv(tmp_path / "custom.onnx", op="MadeUpOp")
    with pytest.raises(
        ModelError,
        match=r"custom.onnx: (TVM's ONNX frontend cannot convert it|not a valid ONNX model).*MadeUpOp",
    ):
        load_model(path)


def test_truncated_onnx_file(tmp_path: Path) -> None:
    path = _onnx_conv(tmp_path / "conv.onnx")
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(ModelError, match="conv.onnx: not a valid ONNX model"):
        load_model(path)


def _with_external_weights(folder: Path) -> Path:
    """The conv model with its weight in ``folder/weights.bin``, as large ONNX models ship."""
    folder.mkdir()
    model = onnx.load(str(_onnx_conv(folder / "inline.onnx")))
    path = folder / "conv.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    return path


def _relocate(path: Path, location: str) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, str(path))


def test_onnx_external_weights_beside_the_model(tmp_path: Path) -> None:
    path = _with_external_weights(tmp_path / "model")
    mod, params = load_model(path)
    inline, inline_params = load_model(path.parent / "inline.onnx")
    assert tvm.ir.structural_equal(mod, inline)
    assert params.keys() == inline_params.keys()


@pytest.mark.parametrize("how", ["symlink", "parent", "absolute", "linked folder"])
def test_onnx_external_data_may_not_leave_the_model_folder(tmp_path: Path, how: str) -> None:
    path = _with_external_weights(tmp_path / "model")
    secret = tmp_path / "secret.bin"
    secret.write_bytes((path.parent / "weights.bin").read_bytes())  # would load, if followed
    if how == "symlink":
        (path.parent / "link").symlink_to(secret)
        location = "link"
    elif how == "linked folder":
        (path.parent / "data").symlink_to(tmp_path)
        location = "data/secret.bin"
    else:
        location = "../secret.bin" if how == "parent" else str(secret)
    _relocate(path, location)
    why = "through the symlink" if "link" in how else "outside the model's folder"
    with pytest.raises(ModelError, match=f"conv.onnx: external tensor data .* lies {why}"):
        load_model(path)


def test_tflite_model(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "fc.tflite"
    path.write_bytes(fully_connected_model(rng.standard_normal((4, 8)), rng.standard_normal(4)))
    mod, params = load_model(path)
    tasks = extract_task_from_relay(mod, X86, params)
    assert any("dense" in t.task_name for t in tasks)
    reference, reference_params = relay.frontend.from_tflite(
        __import__("tflite").Model.GetRootAsModel(path.read_bytes(), 0)
    )
    expected = ms.relay_integration.extract_tasks(
        reference, tvm.target.Target(X86), reference_params
    )
    assert_same_extracted_tasks(list(expected), tasks)


def test_truncated_tflite_file(tmp_path: Path) -> None:
    path = tmp_path / "fc.tflite"
    path.write_bytes(fully_connected_model(np.ones((4, 8)), np.ones(4))[:40])
    with pytest.raises(ModelError, match="fc.tflite: not a valid TFLite model"):
        load_model(path)


def test_unknown_format_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x00\x01")
    with pytest.raises(
        ModelError, match="cannot tell the model format from the suffix '.bin'.*--model-format"
    ):
        load_model(path)


def test_model_format_overrides_the_suffix(tmp_path: Path) -> None:
    path = _onnx_conv(tmp_path / "conv.onnx")
    renamed = path.rename(tmp_path / "conv.model")
    mod, _ = load_model(renamed, model_format="onnx")
    assert "nn.conv2d" in mod.astext()


def test_missing_file() -> None:
    with pytest.raises(ModelError, match="nowhere.onnx: no such file"):
        load_model("nowhere.onnx")


@pytest.mark.parametrize(
    ("text", "shapes", "dtypes"),
    [
        ("data:[1,3,224,224]", {"data": [1, 3, 224, 224]}, {}),
        ("a:[1,2] b:[3]", {"a": [1, 2], "b": [3]}, {}),
        ("input_ids:[1, 128],mask:[1,128]", {"input_ids": [1, 128], "mask": [1, 128]}, {}),
        ("ids:[1,128]:int64 x:[2]", {"ids": [1, 128], "x": [2]}, {"ids": "int64"}),
        ("x:[2]:float16,y:[]", {"x": [2], "y": []}, {"x": "float16"}),
    ],
)
def test_parse_shapes(text: str, shapes: dict, dtypes: dict) -> None:
    assert parse_shapes(text) == (shapes, dtypes)


@pytest.mark.parametrize(
    "text", ["data", "data:[1,x]", "data:[1,2] junk", "ids:[1,128]:notatype", "ids:[1]:"]
)
def test_parse_shapes_rejects(text: str) -> None:
    """A spelling mistake on the command line is a usage error (exit 2), not a bad model."""
    with pytest.raises(UsageError):
        parse_shapes(text)
