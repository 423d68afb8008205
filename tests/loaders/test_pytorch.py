"""PyTorch models in: TorchScript files through the CLI, modules through ``load_model``, the
drop-in on a converted module, and one clear error line for each way it can go wrong."""

from __future__ import annotations

import json
import re
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Tuple  # noqa: UP035 (TorchScript reads the annotations)

import pytest
import torch
import tvm
from tvm import meta_schedule as ms
from tvm import relay

import relay_tasks
from relay_tasks import DependencyError, ModelError, load_model
from relay_tasks.adapters.meta_schedule import extract_task_from_relay
from relay_tasks.cli import main

from checks import assert_same_extracted_tasks
from frontend_models import torch_module
from zoo import X86, copy_module


class Tiny(torch.nn.Module):
    """conv + relu + mean + linear: a handful of ops, converted in a fraction of a second."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class Embedding(torch.nn.Module):
    """Token ids in (int64), as language models take them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.embed(ids), -1)


class Unconvertible(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cummax(x, 0)[0]


def _inputs(mod: tvm.IRModule) -> list[tuple[str, str]]:
    """main's inputs (the parameters that are not weights), as (name, type) text."""
    return [
        (p.name_hint, str(p.type_annotation))
        for p in mod["main"].params
        if not p.name_hint.startswith("aten::")
    ]


def _save(module: torch.nn.Module, example: torch.Tensor, path: Path) -> Path:
    torch.manual_seed(0)
    with torch.no_grad():
        torch.jit.trace(module.eval(), example).save(str(path))
    return path


@pytest.fixture()
def tiny_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return _save(Tiny(), torch.randn(1, 3, 16, 16), tmp_path / "tiny.pt")


def test_a_traced_torchvision_resnet18_gives_upstreams_tasks_three_ways(tmp_path: Path, capsys):
    """The issue's acceptance test: a torchvision ResNet-18 traced and saved, then extracted by
    the CLI, by extract_task_from_relay and by upstream's own function with relay-tasks
    installed, all equal to upstream on the module TVM's frontend makes of the same file."""
    module, example = torch_module("torchvision-resnet18")
    path = _save(module, example, tmp_path / "resnet18.pt")
    reference, params = relay.frontend.from_pytorch(
        torch.jit.load(str(path)), [("input0", ((1, 3, 224, 224), "float32"))]
    )
    expected = list(
        ms.relay_integration.extract_tasks(copy_module(reference), tvm.target.Target(X86), params)
    )
    assert len(expected) > 10

    shapes = "input0:[1,3,224,224]"
    argv = ["extract", str(path), "--input-shapes", shapes, "--target", X86, "--format", "json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["tasks"]
    assert [(r["name"], r["weight"]) for r in rows] == [
        (str(t.task_name), int(t.weight)) for t in expected
    ]

    mod, loaded_params = load_model(path, shapes={"input0": [1, 3, 224, 224]})
    assert_same_extracted_tasks(expected, extract_task_from_relay(mod, X86, loaded_params))
    with relay_tasks.installed():
        dropped_in = ms.relay_integration.extract_tasks(
            copy_module(reference), tvm.target.Target(X86), params
        )
    assert_same_extracted_tasks(expected, list(dropped_in))


def test_module_objects_are_traced_in_eval_mode_without_grad() -> None:
    torch.manual_seed(0)
    module = Tiny().train()
    mod, params = load_model(module, example_inputs=torch.randn(1, 3, 16, 16))
    assert module.training, "the caller's module keeps its mode"
    assert _inputs(mod) == [("x", "Tensor[(1, 3, 16, 16), float32]")]  # forward's argument name
    assert len(params) == 4
    # From shapes alone (zeros are traced), and as a ScriptModule.
    by_shape, _ = load_model(Tiny(), shapes={"image": [2, 3, 16, 16]})
    assert _inputs(by_shape) == [("image", "Tensor[(2, 3, 16, 16), float32]")]
    scripted = torch.jit.trace(Tiny().eval(), torch.randn(1, 3, 16, 16))
    from_script, _ = load_model(scripted, example_inputs=torch.randn(1, 3, 16, 16))
    assert _inputs(from_script) == _inputs(mod)


def test_int64_token_ids(tmp_path: Path) -> None:
    path = _save(Embedding(), torch.zeros(1, 8, dtype=torch.int64), tmp_path / "embed.pt")
    mod, params = load_model(path, shapes={"ids": [1, 8]}, dtypes={"ids": "int64"})
    assert _inputs(mod) == [("ids", "Tensor[(1, 8), int64]")]
    traced, _ = load_model(Embedding(), example_inputs=torch.zeros(1, 8, dtype=torch.int64))
    assert _inputs(traced) == _inputs(mod)
    names = [t.task_name for t in extract_task_from_relay(mod, X86, params)]
    assert any("take" in name for name in names), names


def _tampered_version(source: Path, target: Path) -> Path:
    """The same archive with the file-format version a newer torch writes."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            new.writestr(item, b"99\n" if item.filename.endswith("/version") else data)
    return target


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _pickled(path: Path) -> Path:
    torch.save(Tiny(), str(path))
    return path


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (
            lambda tmp, tiny: tiny,
            [],
            r"tiny.pt: PyTorch models need input shapes, in input order; give --input-shapes 'x:\[...\]'",
        ),
        (
            lambda tmp, tiny: tiny,
            ["--input-shapes", "x:[1,3,16,16] y:[2]"],
            r"the model takes 1 input\(s\) \(x\), --input-shapes gives 2 \(x, y\)",
        ),
        (
            lambda tmp, tiny: tiny,
            ["--input-shapes", "x:[1,4,16,16]"],
            r"TVM's PyTorch frontend failed: The Relay type checker .* dimension 1 conflicts: 4 does not match 3.*\(input shapes given: x:\[1, 4, 16, 16\]",
        ),
        (
            lambda tmp, tiny: _save(Unconvertible(), torch.randn(4, 4), tmp / "cummax.pt"),
            ["--input-shapes", "x:[4,4]"],
            r"its TorchScript code \(__torch__/test_pytorch.py\) calls aten::cummax, which TVM's "
            r"frontend cannot convert; .* export it with torch.onnx.export",
        ),
        (
            lambda tmp, tiny: _tampered_version(tiny, tmp / "newer.pt"),
            ["--input-shapes", "x:[1,3,16,16]"],
            r"newer.pt: cannot load the TorchScript file: it was saved by a newer PyTorch \(file format 99; torch 2.2.2.*, the version TVM's frontend needs, reads up to \d+\); export it with torch.onnx.export",
        ),
        (
            lambda tmp, tiny: _pickled(tmp / "pickled.pt"),
            ["--input-shapes", "x:[1,3,16,16]"],
            r"pickled.pt: a torch.save checkpoint, not TorchScript \(relay-tasks does not unpickle model files",
        ),
        (
            lambda tmp, tiny: _write(tmp / "garbage.pth", b"not a model"),
            ["--input-shapes", "x:[1]"],
            r"garbage.pth: not a TorchScript file \(not a zip archive",
        ),
        (
            lambda tmp, tiny: _write(tmp / "model.bin", tiny.read_bytes()),
            ["--model-format", "pytorch", "--input-shapes", "x:[1,3,16,16]:float16"],
            r"model.bin: TVM's PyTorch frontend failed: .*float16",
        ),
    ],
    ids=[
        "no-input-shapes",
        "too-many-shapes",
        "wrong-shape",
        "unconvertible-op",
        "newer-torch",
        "pickle",
        "not-a-zip",
        "wrong-dtype",
    ],
)
def test_bad_pytorch_input_is_one_line_and_exit_3(
    tmp_path: Path, tiny_file: Path, make, args, message, capsys
) -> None:
    path = make(tmp_path, tiny_file)
    assert main(["extract", str(path), "--target", X86, *args]) == ModelError.exit_code
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("relay-tasks: error: ")
    assert re.search(message, lines[0]), lines[0]


def test_without_torch_a_dependency_error_names_the_extra(
    tiny_file: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(DependencyError, match=r"pip install 'relay-tasks\[torch\]'"):
        load_model(tiny_file, shapes={"x": [1, 3, 16, 16]})
    assert main(["extract", str(tiny_file), "--input-shapes", "x:[1,3,16,16]"]) == 5
    assert "relay-tasks[torch]" in capsys.readouterr().err


def test_module_errors() -> None:
    with pytest.raises(
        ModelError, match="expected a torch.nn.Module or torch.jit.ScriptModule, got object"
    ):
        load_model(object())
    with pytest.raises(ModelError, match="tracing Tiny needs example_inputs or input shapes"):
        load_model(Tiny())
    with pytest.raises(ModelError, match="example_inputs apply to PyTorch models only"):
        load_model("resnet-18", example_inputs=torch.zeros(1))

    class ReturnsDict(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict:
            return {"y": x + 1}

    with pytest.raises(ModelError, match="cannot trace ReturnsDict: .*torchscript=True"):
        load_model(ReturnsDict(), example_inputs=torch.zeros(2))


class _WritesOnLoad(torch.nn.Module):
    """A module whose ``__setstate__`` runs while ``torch.jit.load`` reads the file, and
    creates (or overwrites) the file named in ``marker``: what ``torch.from_file`` with
    ``shared=True`` does to any path."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.weight = torch.zeros(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, torch.Tensor, bool]:  # noqa: UP006 (TorchScript)
        return (self.marker, self.weight, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, torch.Tensor, bool]) -> None:  # noqa: UP006
        self.marker = state[0]
        self.weight = torch.from_file(state[0], True, 4)
        self.training = state[2]


def test_torchscript_code_outside_the_allowlist_never_runs(tmp_path: Path, capsys) -> None:
    """Issue 26: TorchScript is code. The archive's source is read with Python's ast before
    torch loads it: no special method, only operators the frontend converts."""
    marker = tmp_path / "written"
    path = tmp_path / "evil.pt"
    torch.jit.script(_WritesOnLoad(str(marker))).save(str(path))
    assert not marker.exists()  # saving ran nothing
    assert main(["extract", str(path), "--input-shapes", "x:[4]"]) == 3
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "its TorchScript code" in err
    assert "defines __getstate__" in err or "defines __setstate__" in err
    assert not marker.exists()
    torch.jit.load(str(path))  # the payload is live: torch's own loader runs it
    assert marker.exists()


def _forged(path: Path, how: str) -> None:
    """Rewrite the TorchScript archive at ``path`` the way an attacker would hide its code from
    a screen that reads the archive differently from torch."""
    with zipfile.ZipFile(path) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    folder = entries[0][0].filename.split("/", 1)[0]
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as out:
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of the duplicate name
        for info, data in entries:
            code = "/code/" in info.filename and info.filename.endswith(".py")
            if code and how == "padded":  # past the screen's size limit, deflated to little
                data += b"\n#" + b" " * (17 << 20) + b"\n"
                info.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(info, data)
            if code and how == "duplicate":  # zipfile reads the last of two, torch the first
                out.writestr(info.filename, b"class Plain(Module):\n  pass\n")
        if how == "outside":
            out.writestr(f"{folder}/../elsewhere.py", b"")


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("duplicate", "two entries named"),
        ("padded", "a code file of 1"),
        ("outside", "outside the archive's folder"),
    ],
)
def test_an_archive_read_otherwise_than_torch_reads_it_is_refused(
    how: str, message: str, tmp_path: Path, capsys
) -> None:
    """Issue 50: two entries of one name (Python's zipfile returns the last, torch the first)
    and a code file over the screen's size limit (skipped before) let ``__setstate__`` run
    during ``extract``. Each forgery is refused in one line and nothing runs."""
    marker = tmp_path / "written"
    path = tmp_path / "evil.pt"
    torch.jit.script(_WritesOnLoad(str(marker))).save(str(path))
    _forged(path, how)
    if how != "outside":
        torch.jit.load(str(path))  # the forgery loads and runs its payload in torch
        assert marker.exists()
        marker.unlink()
    assert main(["extract", str(path), "--input-shapes", "x:[4]"]) == 3
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert not marker.exists()
