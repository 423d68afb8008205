"""ONNX Runtime timed beside the tuned build: what the user would run instead.

ONNX Runtime is an optional extra (``pip install 'relay-tasks[versus]'``). It reads the model
file itself, and a model file is untrusted data: every session is made and run in a confined
child (:mod:`relay_tasks.sandbox`), one per round of the comparison, which hands back its times
and outputs as plain numbers. Its threads are this machine's cores, as TVM's thread pool's are;
a repeat lasts at least as long as one of TVM's (the model run as often as that takes).
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError, UsageError, describe_failure
from ..sandbox import Pieces, run_confined

#: What ``--versus`` can time.
RUNTIMES = ("onnxruntime",)


def check_versus(runtime: str, source: str, remote: bool) -> None:
    """Refuse what cannot be compared before anything is built."""
    if remote:
        raise UsageError("--versus times on this machine only; drop --rpc-tracker")
    if not source.lower().endswith(".onnx"):
        raise UsageError(f"--versus {runtime} needs an ONNX model file; {source} is not one "
                         "(export the model to ONNX and compile that)")  # fmt: skip
    try:
        import onnxruntime  # noqa: F401
    except ImportError as err:
        raise UsageError(
            "ONNX Runtime is not installed: pip install 'relay-tasks[versus]'"
        ) from err


class OnnxRuntime:
    """A model file timed by ONNX Runtime's CPU provider, on ``inputs`` (by input name)."""

    def __init__(self, path: str | Path, inputs: dict[str, np.ndarray[Any, Any]]) -> None:
        self.path, self.inputs = Path(path), inputs

    @property
    def name(self) -> str:
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"

    def time(self, count: int, min_repeat_ms: int) -> list[float]:
        """Seconds per run in each of ``count`` repeats (after a warm-up run)."""

        def work() -> Pieces:
            session, feed = self._session()
            session.run(None, feed)  # warm-up
            started = time.perf_counter()
            session.run(None, feed)
            once = max(time.perf_counter() - started, 1e-9)
            number = max(1, math.ceil(min_repeat_ms / 1e3 / once))
            times = []
            for _ in range(count):
                started = time.perf_counter()
                for _ in range(number):
                    session.run(None, feed)
                times.append((time.perf_counter() - started) / number)
            return [np.asarray(times, dtype="float64").tobytes()]

        data = run_confined(work, f"timing {self.path} with ONNX Runtime")
        return [float(t) for t in np.frombuffer(data, dtype="float64")]

    def outputs(self) -> list[np.ndarray[Any, Any]]:
        """The model's outputs on the inputs, as plain arrays: each a header (dtype, shape)
        and its raw bytes, checked here before it is viewed as an array."""

        def work() -> Pieces:
            session, feed = self._session()
            pieces: list[bytes] = []
            for value in session.run(None, feed):
                array = np.ascontiguousarray(value)
                header = json.dumps({"dtype": array.dtype.str, "shape": array.shape}).encode()
                pieces += [struct.pack("<QQ", len(header), array.nbytes), header, array.tobytes()]
            return pieces

        data = bytes(run_confined(work, f"running {self.path} with ONNX Runtime"))
        arrays, at = [], 0
        while at < len(data):
            size, nbytes = struct.unpack_from("<QQ", data, at)
            header = json.loads(data[at + 16 : at + 16 + size])
            dtype, shape = np.dtype(str(header["dtype"])), tuple(int(d) for d in header["shape"])
            body = data[at + 16 + size : at + 16 + size + nbytes]
            if (
                dtype.kind not in "biuf"
                or len(body) != nbytes
                or math.prod(shape) * dtype.itemsize != nbytes
            ):
                raise ModelError(f"ONNX Runtime's answer for {self.path} is not plain arrays")
            arrays.append(np.frombuffer(body, dtype=dtype).reshape(shape))
            at += 16 + size + nbytes
        return arrays

    def _session(self) -> tuple[Any, dict[str, np.ndarray[Any, Any]]]:
        """In the child: ONNX Runtime's session of the model and its inputs' values."""
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            session = onnxruntime.InferenceSession(
                str(self.path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # ONNX Runtime's own errors (Fail, InvalidGraph, ...)
            raise ModelError(f"ONNX Runtime cannot run {self.path}: {describe_failure(err)}; "
                             "compare without --versus") from err  # fmt: skip
        missing = [i.name for i in session.get_inputs() if i.name not in self.inputs]
        if missing:
            raise UsageError(f"{self.path}: ONNX Runtime asks for inputs {missing} that the "
                             "model's Relay form does not have")  # fmt: skip
        return session, {i.name: self.inputs[i.name] for i in session.get_inputs()}
