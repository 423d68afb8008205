"""Where a tuned model loses to ONNX Runtime: each operator of our library beside ONNX
Runtime's, inside the model, by what the operator computes.

    ./dev bench --where MODEL.onnx LIBRARY.so         # LIBRARY.so from relay-tasks compile

A tuner times each task alone, its data in cache; what a user sees is the model, each weight
coming from memory once a run. So this times both runtimes inside the model on the same seeded
inputs: every call of our library with TVM's debug executor (as ``compile --profile`` does),
every node of ONNX Runtime's CPU provider with its profiler, ``--runs`` runs each, medians per
call. A fused function and an ONNX Runtime node compute the same operator when they have the
same signature: a convolution's input and output channels, kernel size, input and output
height and whether it is depthwise; a matrix product's batch, rows, columns and depth. Our
layouts are read back to these (NCHWc blocks, the NHWC of ``--winograd``'s convolutions). The
table gives each signature's calls and time on both sides, the slowest of ours first, then
what pairs with nothing (our layout conversions and elementwise functions, ONNX Runtime's
fused normalisations): those say which tasks hold the model back, the rows that
``status``'s per-task figures cannot show. Both profilers add their own cost per call, so
each side's sum runs above its timed latency. The library is loaded as code: give it one
``relay-tasks compile`` built here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relay_tasks.errors import RelayTasksError
from relay_tasks.loaders import load_model
from relay_tasks.sandbox import run_confined
from relay_tasks.table import aligned
from relay_tasks.tuning.compile import random_inputs

#: What an operator computes, told apart across runtimes: ("conv", in channels, out channels,
#: kernel, in height, out height, depthwise), ("matmul", batch, rows, columns, depth),
#: ("conv_transpose", in channels, out channels, in height, out height), or ("other", name).
Signature = tuple[Any, ...]
Shape = Sequence[int]


def ours(function: str, inputs: Sequence[Shape], output: Shape) -> Signature:
    """The signature of our fused ``function`` from its argument shapes as the graph holds
    them (the first output's last)."""
    if "conv2d_transpose" in function:
        return ("conv_transpose", inputs[0][1], output[1], inputs[0][2], output[2])
    if "conv2d" in function:
        data = inputs[0]
        depthwise = "depthwise" in function
        if "winograd" in function:  # NHWC, 3x3 (its kernel is already transformed)
            return ("conv", data[3], output[3], 3, data[1], output[1], depthwise)
        blocked = len(data) == 5  # NCHW[x]c: channels are chunks times block
        channels = data[1] * data[4] if blocked else data[1]
        out = output[1] * output[4] if blocked else output[1]
        return ("conv", channels, out, inputs[1][2], data[2], output[2], depthwise)
    if "dense" in function or "matmul" in function:
        batch = math.prod(output[:-2]) if "batch_matmul" in function else 1
        rows = math.prod(output[:-1]) // batch
        return ("matmul", batch, rows, output[-1], inputs[0][-1])
    return ("other", function.removeprefix("tvmgen_default_"))


def theirs(op: str, inputs: Sequence[Shape], outputs: Sequence[Shape]) -> Signature:
    """The signature of an ONNX Runtime node of type ``op`` from its profiled shapes (NCHW;
    pre-packed weights may be missing from ``inputs``)."""
    if op in ("Conv", "FusedConv"):
        data, weight, out = inputs[0], inputs[1], outputs[0]
        depthwise = weight[1] == 1 and data[1] > 1
        return ("conv", data[1], out[1], weight[2], data[2], out[2], depthwise)
    if op == "ConvTranspose":
        return ("conv_transpose", inputs[0][1], outputs[0][1], inputs[0][2], outputs[0][2])
    if op in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm", "MatMulNBits"):
        out = outputs[0]
        stacked = len(inputs) > 1 and len(inputs[1]) > 2  # both operands batched
        batch = math.prod(out[:-2]) if stacked else 1
        return ("matmul", batch, math.prod(out[:-1]) // batch, out[-1], inputs[0][-1])
    return ("other", op)


def _our_calls(library: Path, inputs: dict[str, Any], runs: int) -> list[tuple[Signature, float]]:
    """Each call of the library's model: its signature and its median seconds."""
    import tvm  # after relay_tasks, which sets up TVM's parallel launch

    factory = tvm.runtime.load_module(str(library))
    graph = json.loads(factory["get_graph_json"]())
    shapes, rows = graph["attrs"]["shape"][1], graph["node_row_ptr"]
    calls = []
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] == "tvm_op":
            arguments = [shapes[rows[i] + j] for i, j, _ in node["inputs"]]
            calls.append((node["attrs"]["func_name"], arguments, shapes[rows[nid]]))
    debug = factory["debug_create"]("default", tvm.cpu(0))
    for name, value in inputs.items():
        debug["set_input"](name, tvm.nd.array(value))
    debug["run"]()  # warm-up
    seconds: list[list[float]] = [[] for _ in calls]
    for _ in range(runs):
        profiled = debug["profile"](None).calls
        if [str(c["Name"]) for c in profiled] != [name for name, _, _ in calls]:
            sys.exit(f"{library}: the debug executor's calls are not the graph's functions")
        for times, call in zip(seconds, profiled, strict=True):
            times.append(float(call["Duration (us)"].microseconds) * 1e-6)
    return [(ours(name, arguments, output), float(np.median(times)))
            for (name, arguments, output), times in zip(calls, seconds, strict=True)]  # fmt: skip


def _their_calls(model: Path, inputs: dict[str, Any], runs: int) -> list[tuple[Signature, float]]:
    """Each node ONNX Runtime runs for ``model``: its signature and its median seconds. ONNX
    Runtime reads the model in the confined child that reads model files (as ``compile
    --versus`` runs it); its profile comes back as bytes."""

    def work() -> list[bytes]:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "where")  # its scratch
        session = onnxruntime.InferenceSession(str(model), options, ["CPUExecutionProvider"])
        feed = {i.name: inputs[i.name] for i in session.get_inputs()}
        session.run(None, feed)  # warm-up, profiled too: left out below
        for _ in range(runs):
            session.run(None, feed)
        return [Path(session.end_profiling()).read_bytes()]

    events = json.loads(bytes(run_confined(work, f"profiling {model} with ONNX Runtime")))
    times: dict[str, list[float]] = defaultdict(list)
    signature: dict[str, Signature] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        args = event["args"]
        shapes = [[next(iter(s.values())) for s in args.get(f"{side}_type_shape", [])]
                  for side in ("input", "output")]  # fmt: skip
        signature[event["name"]] = theirs(args["op_name"], *shapes)
        times[event["name"]].append(event["dur"] * 1e-6)
    return [(signature[node], float(np.median(t[1:]))) for node, t in times.items()]


def table(mine: list[tuple[Signature, float]], other: list[tuple[Signature, float]]) -> str:
    """Both runtimes' calls added up by signature, paired ones first (slowest of ours first),
    then each side's unpaired ones."""
    totals: dict[Signature, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for side, calls in ((0, mine), (2, other)):
        for key, seconds in calls:
            totals[key][side] += 1
            totals[key][side + 1] += seconds
    paired = {k: v for k, v in totals.items() if k[0] != "other" and v[0] and v[2]}
    rows = [["ours ms", "calls", "ONNX Runtime ms", "calls", "ours / theirs", "signature"]]
    for key, (n, s, m, t) in sorted(paired.items(), key=lambda kv: -kv[1][1]):
        rows.append([f"{s * 1e3:.3f}", str(int(n)), f"{t * 1e3:.3f}", str(int(m)),
                     f"{s / t:.2f}", " ".join(map(str, key))])  # fmt: skip
    alone = [(k, v) for k, v in totals.items() if k not in paired]
    for key, (n, s, m, t) in sorted(alone, key=lambda kv: -(kv[1][1] + kv[1][3])):
        rows.append([f"{s * 1e3:.3f}" if n else "-", str(int(n)) if n else "-",
                     f"{t * 1e3:.3f}" if m else "-", str(int(m)) if m else "-", "-",
                     " ".join(map(str, key))])  # fmt: skip
    same = [sum(v[i] for v in paired.values()) for i in (1, 3)]
    every = [sum(v[i] for v in totals.values()) for i in (1, 3)]
    lines = aligned(rows, left={5})
    lines.append(f"paired: ours {same[0] * 1e3:.3f} ms, ONNX Runtime {same[1] * 1e3:.3f} ms "
                 f"({same[0] / same[1]:.2f}x); all calls: ours {every[0] * 1e3:.3f} ms, "
                 f"ONNX Runtime {every[1] * 1e3:.3f} ms ({every[0] / every[1]:.2f}x)")  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", type=Path, help="the ONNX file the library was compiled from")
    parser.add_argument("library", type=Path, help="relay-tasks compile's -o")
    parser.add_argument("--runs", type=int, default=15)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    try:
        mod, params = load_model(str(args.model))
        inputs = random_inputs(mod, params)
        print(table(_our_calls(args.library, inputs, args.runs),
                    _their_calls(args.model, inputs, args.runs)))  # fmt: skip
    except RelayTasksError as err:
        sys.exit(f"where: {err}")


if __name__ == "__main__":
    main()
