"""Nothing a file brings (model, task file, tuning log) is run as Python: the package has no way to.

A syntax-level check over every module, so that a new ``eval`` or a TVMScript round trip cannot
slip in unnoticed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import relay_tasks

#: Builtins that run text as code.
CODE_BUILTINS = {"eval", "exec", "compile", "__import__"}
#: Modules whose loaders run code embedded in the data.
CODE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "marshal",
    "shelve",
    "joblib",
}
#: Attribute calls that parse TVMScript / Python, or unpickle.
CODE_ATTRIBUTES = {"from_source", "ir_module", "prim_func", "load", "loads"}
#: ``x.load(...)``/``x.loads(...)`` are fine for these readers of plain data.
PLAIN_READERS = {"json", "onnx", "tflite", "Model"}


def offences(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [f"imports {n}" for n in names if n.split(".")[0] in CODE_MODULES]
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tvm.script"):
                found.append(f"imports from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in CODE_BUILTINS:
                found.append(f"calls {func.id}()")
            elif isinstance(func, ast.Attribute) and func.attr in CODE_ATTRIBUTES:
                owner = (
                    func.value.attr
                    if isinstance(func.value, ast.Attribute)
                    else getattr(func.value, "id", "")
                )
                if func.attr in {"load", "loads"} and owner in PLAIN_READERS:
                    continue
                if func.attr == "load" and owner == "jit":  # TorchScript: its own restricted reader
                    continue
                found.append(f"calls {owner}.{func.attr}()")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "eval(text)",
        "import pickle",
        "from tvm.script import from_source",
        "tvm.script.from_source(text)",
        "numpy.load(path, allow_pickle=True)",
        "torch.load(path)",
    ],
)
def test_the_check_sees_each_way_of_running_code(source: str) -> None:
    assert offences(source)


def test_no_module_of_the_package_can_run_code_from_data() -> None:
    package = Path(relay_tasks.__file__).parent
    report = {
        str(path.relative_to(package)): offences(path.read_text())
        for path in sorted(package.rglob("*.py"))
    }
    assert len(report) > 20
    assert {name: found for name, found in report.items() if found} == {}


def test_tvms_pickle_cache_in_the_current_directory_is_never_read(tmp_path: Path) -> None:
    """``import tvm.relay`` unpickles ``.pkl_memoize_py3/...`` from the current directory
    (TVM's winograd memoization); with relay-tasks imported first, nothing there is read."""
    cache = tmp_path / ".pkl_memoize_py3"
    cache.mkdir()
    marker = tmp_path / "ran"
    payload = (
        "import os, pickle\n"
        "class P:\n"
        f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
        "pickle.dump(P(), open('.pkl_memoize_py3/"
        "topi.nn.winograd_matrices.winograd_transform_matrices.pkl', 'wb'))\n"
    )
    run = lambda code: subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)  # noqa: E731
    run(payload)
    run("import relay_tasks, tvm.relay, tvm.topi.nn.winograd_util")
    assert not marker.exists()
    run("import tvm.relay")  # the file is live: TVM alone runs it
    assert marker.exists()
