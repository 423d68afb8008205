"""Loading model files: ONNX, TFLite, Relay text and the zoo, with clear errors for bad files."""

from __future__ import annotations

import os
import re
import struct
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
from relay_tasks.loaders.relay_text import load_params
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


def _relocate(path: Path, location: str, length: str | None = None) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
        if entry.key == "length" and length is not None:
            entry.value = length
    onnx.save(model, str(path))


def test_onnx_external_weights_beside_the_model(tmp_path: Path) -> None:
    path = _with_external_weights(tmp_path / "model")
    mod, params = load_model(path)
    inline, inline_params = load_model(path.parent / "inline.onnx")
    assert tvm.ir.structural_equal(mod, inline)
    assert params.keys() == inline_params.keys()


EXTERNAL_ATTACKS = {
    "symlink": "passes through a symlink",
    "linked folder": "passes through a symlink",
    "parent": "is not a path of plain names inside the model's folder",
    "absolute": "is not a path of plain names inside the model's folder",
    "hidden, as onnx strips it": "is not a path of plain names inside the model's folder",
    "a NUL byte": "is not a path of plain names inside the model's folder",
    "a FIFO": "is not a regular file",
    "past the end": "asks for bytes 0 to 1000000 of a",
}


@pytest.mark.parametrize("how", EXTERNAL_ATTACKS)
def test_onnx_external_data_is_only_a_regular_file_in_the_model_folder(
    tmp_path: Path, how: str
) -> None:
    """Issue 26: onnx 1.15 opens ``join(base, location.lstrip("/."))`` and follows links, so
    the weights are read by relay-tasks itself, component by component, without following."""
    path = _with_external_weights(tmp_path / "model")
    secret = tmp_path / "secret.bin"
    secret.write_bytes((path.parent / "weights.bin").read_bytes())  # would load, if followed
    length = None
    if how == "symlink":
        (path.parent / "link").symlink_to(secret)
        location = "link"
    elif how == "linked folder":
        (path.parent / "data").symlink_to(tmp_path)
        location = "data/secret.bin"
    elif how == "hidden, as onnx strips it":
        (path.parent / "evil").symlink_to(tmp_path)
        location = ".evil/secret.bin"
    elif how == "a NUL byte":
        location = "weights.bin\0"
    elif how == "a FIFO":
        os.mkfifo(path.parent / "pipe")
        location = "pipe"
    elif how == "past the end":
        location, length = "weights.bin", "1000000"
    else:
        location = "../secret.bin" if how == "parent" else str(secret)
    _relocate(path, location, length)
    with pytest.raises(
        ModelError, match=f"conv.onnx: external tensor data .* {EXTERNAL_ATTACKS[how]}"
    ):
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


def _params_claiming(ndim: int, dims: tuple[int, ...] = ()) -> bytes:
    """A params file of one array whose header claims ``ndim`` dimensions (97 bytes for the
    issue's ``ndim`` of 2**30: TVM's reader allocated 1.3 GB for its shape before refusing)."""
    name = b"w"
    header = struct.pack("<QQQQ", 0xF7E58D4F05049CB7, 0, 1, len(name)) + name
    array = struct.pack("<QQQ", 1, 0xDD5E40F096B4A13F, 0) + struct.pack("<ii", 1, 0)
    array += struct.pack("<iBBH", ndim, 2, 32, 1) + struct.pack(f"<{len(dims)}q", *dims)
    return header + array + struct.pack("<q", 4)


@pytest.mark.parametrize(
    ("ndim", "dims", "why"),
    [
        (2**30, (), "is not a CPU tensor of a plain dtype"),
        (2, (2**40, 2**20), "claims 4 bytes for its shape"),
        (1, (1,), "it claims 4 bytes at byte"),
    ],
    ids=["huge ndim", "huge shape", "cut short"],
)
def test_a_params_header_is_checked_against_the_file_before_anything_is_allocated(
    tmp_path: Path, ndim: int, dims: tuple[int, ...], why: str
) -> None:
    path = tmp_path / "w.params"
    path.write_bytes(_params_claiming(ndim, dims))
    with pytest.raises(ModelError, match=f"w.params: not a params file .*{why}"):
        load_params(path)
    path.write_bytes(relay.save_param_dict({"w": np.ones((2, 3), "float32")}))
    assert load_params(path)["w"].shape == (2, 3)


_BYOC_TEXT = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 4), float32]) {
  %0 = fn (%y: Tensor[(1, 4), float32], ATTRS) {
    add(%y, %y)
  };
  %0(%x)
}
"""


@pytest.mark.parametrize(
    ("attrs", "why"),
    [
        ('Compiler="ccompiler", global_symbol="f() {}\\nvoid __attribute__((constructor)) g"',
         "a function for the external compiler 'ccompiler'"),
        ('global_symbol="f() {}\\nvoid g"', "the global_symbol 'f() {}\\\\nvoid g' is not an"),
    ],
    ids=["external compiler", "symbol that is code"],
)  # fmt: skip
def test_relay_text_carrying_code_for_the_c_compiler_is_refused(tmp_path: Path, attrs, why):
    """Issue 26: the ccompiler code generator pastes a function's symbol into C source that
    exporting the library compiles; extraction used to report 0 tasks, silently."""
    path = tmp_path / "evil.relay"
    path.write_text(_BYOC_TEXT.replace("ATTRS", attrs))
    with pytest.raises(ModelError, match=re.escape(f"evil.relay: {why}")):
        load_model(path)
    plain = tmp_path / "plain.relay"
    plain.write_text(_BYOC_TEXT.replace(", ATTRS", ""))
    load_model(plain)


def _with_constants() -> tvm.IRModule:
    x = relay.var("x", shape=(1, 8))
    weight = relay.const(np.arange(32, dtype="float32").reshape(4, 8))
    flags = relay.const(np.array([True, False, True, True]))
    dense = relay.nn.dense(x, weight)
    out = relay.where(flags, dense, relay.const(np.int64(3)).astype("float32"))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))


def test_relay_text_constants_in_its_metadata_read_back(tmp_path: Path) -> None:
    """``astext`` writes constants into a ``#[metadata]`` section; they are read here (not by
    TVM's object JSON reader) and give the model back."""
    mod = _with_constants()
    path = tmp_path / "model.txt"
    path.write_text(mod.astext())
    loaded, _ = load_model(path)
    assert tvm.ir.structural_equal(loaded["main"], mod["main"], map_free_vars=True)


def _metadata_with(mod: tvm.IRModule, key: str, node: object) -> str:
    """The module's text with another kind of object added to its metadata section."""
    text, _, section = mod.astext().partition("\n#[metadata]\n")
    import json as json_

    document = json_.loads(section)
    extra = json_.loads(tvm.ir.save_json(node))
    offset = len(document["nodes"]) - 1
    for added in extra["nodes"][1:]:
        for name, value in added.get("attrs", {}).items():
            if value.isdigit() and int(value) and name not in ("value", "dtype"):
                added["attrs"][name] = str(int(value) + offset)
        if "data" in added:
            added["data"] = [i + offset for i in added["data"]]
    document["nodes"] += extra["nodes"][1:]
    table = document["nodes"][document["root"]]
    table["keys"].append(key)
    table["data"].append(extra["root"] + offset)
    return text + "\n#[metadata]\n" + json_.dumps(document)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("a call", "holds something other than constants"),
        ("a huge array", "holds an array that claims 4000000000 bytes"),
        ("not json", "is not JSON"),
    ],
)
def test_relay_text_metadata_holds_constants_only(change: str, message: str, tmp_path: Path):
    """Issue 50: the metadata section is TVM object JSON, and TVM's reader builds whatever it
    names: a ``tir.call_extern("system", ...)`` reached an operator's compute. Only constants
    are read, each array's size checked against its bytes before it is allocated."""
    mod = _with_constants()
    if change == "a call":
        call = tvm.tir.call_extern("int32", "system", "touch pwned")
        text = _metadata_with(mod, "tir.Call", tvm.runtime.convert([call]))
    elif change == "a huge array":
        head, _, section = mod.astext().partition("\n#[metadata]\n")
        import base64
        import json as json_

        document = json_.loads(section)
        blob = bytearray(base64.b64decode(document["b64ndarrays"][0]))
        # its byte count, after magic, reserved, device, ndim, dtype and the dims
        ndim = struct.unpack_from("<i", blob, 24)[0]
        struct.pack_into("<q", blob, 32 + 8 * ndim, 4_000_000_000)
        document["b64ndarrays"][0] = base64.b64encode(bytes(blob)).decode()
        text = head + "\n#[metadata]\n" + json_.dumps(document)
    else:
        text = mod.astext().replace('"root"', "'root'")
    path = tmp_path / "model.txt"
    path.write_text(text)
    with pytest.raises(ModelError, match=f"#\\[metadata\\] section {message}"):
        load_model(path)


def _file_models(folder: Path) -> dict[str, tuple[str, Path, Path | None, dict]]:
    """A model of each file format: (format, file, params file, input shapes)."""
    import torch

    rng = np.random.default_rng(2)
    tflite = folder / "fc.tflite"
    tflite.write_bytes(fully_connected_model(rng.standard_normal((4, 8)), rng.standard_normal(4)))
    script = folder / "m.pt"
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    torch.jit.trace(module, torch.zeros(1, 3, 8, 8)).save(str(script))
    text, params = folder / "m.txt", folder / "m.params"
    mod = _with_constants()
    text.write_text(mod.astext())
    params.write_bytes(relay.save_param_dict({"x": np.ones((1, 8), "float32")}))
    return {
        "onnx": ("onnx", _onnx_conv(folder / "conv.onnx"), None, {}),
        "tflite": ("tflite", tflite, None, {}),
        "pytorch": ("pytorch", script, None, {"input0": [1, 3, 8, 8]}),
        "relay": ("relay", text, params, {}),
    }


@pytest.mark.parametrize("kind", ["onnx", "tflite", "pytorch", "relay"])
def test_a_file_converted_in_the_sandbox_is_the_converters_own_model(kind, tmp_path) -> None:
    """What the confined child hands back (Relay text and raw arrays) reads back as the very
    module and params the converter made: every constant, shared ones shared, names kept."""
    from relay_tasks.loaders import load_file

    fmt, path, params, shapes = _file_models(tmp_path)[kind]
    here, here_params = load_file(fmt, path, params, shapes, None)
    there, there_params = load_model(path, params=params, shapes=shapes or None)
    assert tvm.ir.structural_equal(there, here)
    assert sorted(there_params) == sorted(here_params)
    for name, value in here_params.items():
        assert np.array_equal(there_params[name].numpy(), value.numpy()), name


#: Damage to a packed model, each refused before anything it claims is allocated.
PACKED_DAMAGE = {
    "a huge array": (lambda h: h["arrays"][0].__setitem__(3, 1 << 40), "in 1099511627776 bytes"),
    "a name with a newline": (lambda h: h["names"].__setitem__(0, "x\ny"), "no short line"),
    "an unknown dtype": (lambda h: h["arrays"][0].__setitem__(1, "object"), "of object"),
    "an array for nothing": (lambda h: h["arrays"][0].__setitem__(0, 7), "which is no parameter"),
}


@pytest.mark.parametrize("damage", PACKED_DAMAGE)
def test_a_packed_model_is_checked_before_it_is_read(damage: str, tmp_path) -> None:
    import json
    import struct

    from relay_tasks.loaders.relay_text import pack_model, unpack_model

    pieces = pack_model(_with_constants(), {})
    header = json.loads(bytes(pieces[1]))
    change, message = PACKED_DAMAGE[damage]
    change(header)
    text = json.dumps(header).encode()
    data = b"".join([struct.pack("<Q", len(text)), text, *(bytes(p) for p in pieces[2:])])
    with pytest.raises(ModelError, match=message):
        unpack_model(memoryview(data), tmp_path / "m.onnx")
