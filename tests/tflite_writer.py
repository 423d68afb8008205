"""Write a tiny TFLite flatbuffer in the test, with the flatbuffers builders the tflite package has.

Enough for one FULLY_CONNECTED (+ fused ReLU) model: no TensorFlow needed, nothing downloaded.
"""

from __future__ import annotations

import importlib

import flatbuffers
import numpy as np
import tflite

# The package re-exports each table's class under its module's name; the builder functions
# live in the modules themselves.
Buffer, FullyConnectedOptions, Model, Operator, OperatorCode, SubGraph, Tensor = (
    importlib.import_module(f"tflite.{name}")
    for name in (
        "Buffer",
        "FullyConnectedOptions",
        "Model",
        "Operator",
        "OperatorCode",
        "SubGraph",
        "Tensor",
    )
)


def _vector(builder, start, items, prepend) -> int:
    start(builder, len(items))
    for item in reversed(items):
        prepend(item)
    return builder.EndVector()


def fully_connected_model(weights: np.ndarray, bias: np.ndarray) -> bytes:
    """data[1, in] -> FULLY_CONNECTED(weights[out, in], bias[out]) -> ReLU -> out[1, out]."""
    out_features, in_features = weights.shape
    builder = flatbuffers.Builder(1024)
    blobs = [b"", b"", weights.astype("float32").tobytes(), bias.astype("float32").tobytes()]
    buffers = []
    for blob in blobs:
        data = builder.CreateByteVector(blob) if blob else None
        Buffer.BufferStart(builder)
        if data is not None:
            Buffer.BufferAddData(builder, data)
        buffers.append(Buffer.BufferEnd(builder))
    specs = [
        ("data", [1, in_features], 0),
        ("out", [1, out_features], 1),
        ("weights", [out_features, in_features], 2),
        ("bias", [out_features], 3),
    ]
    tensors = []
    for name, shape, buffer in specs:
        name_offset = builder.CreateString(name)
        shape_offset = _vector(builder, Tensor.TensorStartShapeVector, shape, builder.PrependInt32)
        Tensor.TensorStart(builder)
        Tensor.TensorAddShape(builder, shape_offset)
        Tensor.TensorAddType(builder, tflite.TensorType.FLOAT32)
        Tensor.TensorAddBuffer(builder, buffer)
        Tensor.TensorAddName(builder, name_offset)
        tensors.append(Tensor.TensorEnd(builder))
    FullyConnectedOptions.FullyConnectedOptionsStart(builder)
    FullyConnectedOptions.FullyConnectedOptionsAddFusedActivationFunction(
        builder, tflite.ActivationFunctionType.RELU
    )
    options = FullyConnectedOptions.FullyConnectedOptionsEnd(builder)
    op_inputs = _vector(
        builder, Operator.OperatorStartInputsVector, [0, 2, 3], builder.PrependInt32
    )
    op_outputs = _vector(builder, Operator.OperatorStartOutputsVector, [1], builder.PrependInt32)
    Operator.OperatorStart(builder)
    Operator.OperatorAddOpcodeIndex(builder, 0)
    Operator.OperatorAddInputs(builder, op_inputs)
    Operator.OperatorAddOutputs(builder, op_outputs)
    Operator.OperatorAddBuiltinOptionsType(builder, tflite.BuiltinOptions.FullyConnectedOptions)
    Operator.OperatorAddBuiltinOptions(builder, options)
    operator = Operator.OperatorEnd(builder)
    sub_tensors = _vector(
        builder, SubGraph.SubGraphStartTensorsVector, tensors, builder.PrependUOffsetTRelative
    )
    sub_inputs = _vector(builder, SubGraph.SubGraphStartInputsVector, [0], builder.PrependInt32)
    sub_outputs = _vector(builder, SubGraph.SubGraphStartOutputsVector, [1], builder.PrependInt32)
    sub_ops = _vector(
        builder, SubGraph.SubGraphStartOperatorsVector, [operator], builder.PrependUOffsetTRelative
    )
    SubGraph.SubGraphStart(builder)
    SubGraph.SubGraphAddTensors(builder, sub_tensors)
    SubGraph.SubGraphAddInputs(builder, sub_inputs)
    SubGraph.SubGraphAddOutputs(builder, sub_outputs)
    SubGraph.SubGraphAddOperators(builder, sub_ops)
    subgraph = SubGraph.SubGraphEnd(builder)
    OperatorCode.OperatorCodeStart(builder)
    OperatorCode.OperatorCodeAddBuiltinCode(builder, tflite.BuiltinOperator.FULLY_CONNECTED)
    OperatorCode.OperatorCodeAddDeprecatedBuiltinCode(
        builder, tflite.BuiltinOperator.FULLY_CONNECTED
    )
    OperatorCode.OperatorCodeAddVersion(builder, 1)
    code = OperatorCode.OperatorCodeEnd(builder)
    codes = _vector(
        builder, Model.ModelStartOperatorCodesVector, [code], builder.PrependUOffsetTRelative
    )
    subgraphs = _vector(
        builder, Model.ModelStartSubgraphsVector, [subgraph], builder.PrependUOffsetTRelative
    )
    buffer_vector = _vector(
        builder, Model.ModelStartBuffersVector, buffers, builder.PrependUOffsetTRelative
    )
    Model.ModelStart(builder)
    Model.ModelAddVersion(builder, 3)
    Model.ModelAddOperatorCodes(builder, codes)
    Model.ModelAddSubgraphs(builder, subgraphs)
    Model.ModelAddBuffers(builder, buffer_vector)
    builder.Finish(Model.ModelEnd(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
