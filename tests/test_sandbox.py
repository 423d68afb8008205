"""The confined child that reads model files (issue 50): no writes outside its scratch folder,
no network, no signals out, bounded memory and CPU time, errors and warnings passed back as
ours; and through the CLI, a converter that misbehaves is harmless."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import socket
import tempfile
from pathlib import Path

import pytest

import relay_tasks
from relay_tasks import ModelError, UnusedParamsWarning, sandbox
from relay_tasks.cli import main
from relay_tasks.sandbox import run_confined


def _errno_of(action) -> list[bytes]:
    """Run ``action`` in the child; its answer: b"ok" or the errno it failed with."""

    def work() -> list[bytes]:
        try:
            action()
        except OSError as err:
            return [errno.errorcode.get(err.errno or 0, "?").encode()]
        return [b"ok"]

    return [bytes(run_confined(work, "testing"))]


def test_the_child_writes_only_in_its_scratch_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    assert _errno_of(lambda: outside.write_text("x")) == [b"EACCES"]
    assert not outside.exists()
    target = tmp_path / "victim.txt"
    target.write_text("the user's file\n")
    assert _errno_of(lambda: open(target, "w").close()) == [b"EACCES"]
    assert _errno_of(lambda: target.unlink()) == [b"EACCES"]
    assert target.read_text() == "the user's file\n"
    assert _errno_of(lambda: Path(tempfile.mkdtemp()).joinpath("f").write_text("x")) == [b"ok"]
    assert _errno_of(lambda: Path(os.devnull).write_text("x")) == [b"ok"]


def test_the_child_imports_nothing_from_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    """As ``python -I``: a ``planted.py`` beside the model (the current folder) is not found."""
    (tmp_path / "planted.py").write_text("import os; os.system('touch pwned')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")

    def imports() -> list[bytes]:
        try:
            __import__("planted")
        except ImportError:
            return [b"not found"]
        return [b"imported"]

    assert bytes(run_confined(imports, "testing")) == b"not found"
    assert not (tmp_path / "pwned").exists()


def test_the_child_has_no_network_and_sends_no_signals_out() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def connect() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass

        assert _errno_of(connect) != [b"ok"]
    parent = os.getpid()
    assert _errno_of(lambda: os.kill(parent, signal.SIGTERM)) == [b"EPERM"]


def test_the_child_runs_out_of_memory_as_one_model_error(monkeypatch) -> None:
    with open("/proc/self/statm") as statm:  # the address space the child starts with
        size = int(statm.read().split()[0]) * resource.getpagesize()
    monkeypatch.setenv(sandbox.MEMORY, str(size + (256 << 20)))
    with pytest.raises(ModelError, match=r"testing: ran out of its .* GiB of memory; raise "):
        run_confined(lambda: [bytearray(1 << 30)], "testing")


def test_the_child_runs_out_of_cpu_time_as_one_model_error(monkeypatch) -> None:
    monkeypatch.setenv(sandbox.SECONDS, "1")

    def spin() -> list[bytes]:
        while True:
            pass

    with pytest.raises(ModelError, match="testing: used up its 1 s of CPU time"):
        run_confined(spin, "testing")


def test_a_crash_in_the_child_is_one_model_error() -> None:
    with pytest.raises(ModelError, match=r"testing: crashed the converter \(SIGSEGV\)"):
        run_confined(lambda: os.kill(os.getpid(), signal.SIGSEGV) or [], "testing")


def test_the_childs_errors_and_warnings_come_back_as_ours() -> None:
    def fails() -> list[bytes]:
        raise relay_tasks.DependencyError("no such package")

    with pytest.raises(relay_tasks.DependencyError, match="^no such package$"):
        run_confined(fails, "testing")

    def warns() -> list[bytes]:
        relay_tasks.errors.warn("a param matches nothing", UnusedParamsWarning)
        return [b"done"]

    with pytest.warns(UnusedParamsWarning, match="a param matches nothing"):
        assert bytes(run_confined(warns, "testing")) == b"done"


def test_what_the_kernel_cannot_enforce_is_said_once(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    monkeypatch.setattr(sandbox, "_told", set())
    for _ in range(2):
        assert bytes(run_confined(lambda: [b"x"], "testing")) == b"x"
    err = capsys.readouterr().err
    assert err.count("runs without Landlock (writes outside its scratch folder") == 1, err


def test_a_converter_that_writes_and_connects_is_harmless_through_the_cli(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The next converter bug, stood in for by a converter that writes a file beside the
    model and reads the user's file: through ``extract``, the write is refused by the kernel
    and the conversion still answers."""
    from relay_tasks.loaders import onnx as onnx_loader

    marker = tmp_path / "written-by-the-converter"
    real = onnx_loader.load_onnx

    def misbehaving(path, shapes=None, dtypes=None):
        with contextlib.suppress(OSError):
            marker.write_text("pwned")
        return real(path, shapes, dtypes)

    monkeypatch.setattr(onnx_loader, "load_onnx", misbehaving)
    model = tmp_path / "model.onnx"
    _small_onnx(model)
    assert main(["extract", str(model)]) == 0
    assert "conv2d_NCHWc" in capsys.readouterr().out
    assert not marker.exists()


def _small_onnx(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), "float32"), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        initializer=[weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
