"""LiteRT (TFLite) conversion in every quantisation mode, the builtin-op check, and a
runner on the `ai_edge_litert` interpreter."""

import logging
import tempfile
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_vit.export.source import ExportError, require_tensorflow_backend
from keras_vit.names import LITERT_MODES as MODES

logger = logging.getLogger("keras_vit")
IO_TYPES = {
    "int8": ("float32", "int8", "uint8"),
    "int8-mixed": ("float32", "int8", "uint8"),
    "int16x8": ("float32", "int16"),
}
CALIBRATED = tuple(IO_TYPES)  # the modes with quantised activations (and input/output options)
# The input types MediaPipe Tasks' ImageClassifier feeds (it refuses an int8 or int16 input tensor).
MEDIAPIPE_IO_TYPES = ("float32", "uint8")
# Ops that int8-mixed computes in float32 (between a DEQUANTIZE and a QUANTIZE), with
# LayerNorm's epsilon ADD. The XNNPACK delegate has no int8 kernels for SOFTMAX, GELU and
# RSQRT (ai-edge-litert 2.3.0), so in an int8 file LiteRT runs them on its builtin kernels,
# single-threaded: S/16 batch 1, 2 threads, 24-25 ms as int8, 16-17 ms with those three in
# float32. Taking the rest of the normalisations (LayerNorm's MEAN, SUB, MUL and epsilon ADD,
# the input scaling, attention's query scaling) to float32 too took another 4-6% off
# (8.6 against 9.1 ms on Zen 5; docs/performance.md). Matmuls, the patch convolution and the
# residual adds stay int8.
MIXED_FLOAT_OPS = ("SOFTMAX", "GELU", "RSQRT", "MEAN", "SUB", "MUL")


class ClassifierModule(tf.Module):
    """`(batch, H, W, C)` float pixels in [0, 255] -> `probability` (one output, as on-device
    classifiers expect), `batch` 1 for LiteRT (None: any). `predict` maps images to logits;
    `variables` are the tf.Variables to save (Keras 3 variables are not tracked by tf.Module)."""

    def __init__(self, predict, variables, image_size, channels=3, batch=1):
        super().__init__()
        self._predict, self._weights = predict, list(variables)
        spec = tf.TensorSpec((batch,) + tuple(image_size) + (channels,), tf.float32, "image")
        self.classify = tf.function(
            lambda image: {"probability": tf.nn.softmax(tf.cast(self._predict(image), tf.float32), -1)},
            input_signature=[spec],
        )


def keras_module(model, batch=1):
    """`model` (a keras_vit ViT, TensorFlow backend) as the `ClassifierModule` `convert` takes
    (`batch` None: any batch, for the ONNX and OpenVINO files)."""
    require_tensorflow_backend()
    return ClassifierModule(
        lambda x: model(x, training=False),
        [v.value for v in model.variables],
        model.config.image_size,
        model.config.channels,
        batch,
    )


def convert(module, mode="float32", calibration_images=None, io_type="float32", per_channel_dense=False):
    """TFLite flatbuffer bytes of `module` (a `ClassifierModule`) in `mode`:

    float32; float16 (weights); dynamic (int8 weights, float activations); int8 (full
    integer, calibrated on `calibration_images`; `io_type` float32, int8 or uint8);
    int8-mixed (int8 matmuls, convolution and residual adds; softmax, GELU and the
    normalisations in float32: faster on CPU, not for integer-only accelerators); int16x8
    (int16 activations, int8 weights; `io_type` float32 or int16).
    Builtin ops only.
    Calibrated modes quantise Dense kernels per tensor unless `per_channel_dense`; int8
    matmul operands are made XNNPACK-ready (`symmetric_matmul_operands`)."""
    if mode not in MODES:
        raise ExportError(f"unknown quantisation mode {mode!r}; choose from {', '.join(MODES)}.")
    allowed_io = IO_TYPES.get(mode, ("float32",))
    if io_type not in allowed_io:
        raise ExportError(f"{mode} takes input/output types {', '.join(allowed_io)}; got {io_type!r}.")
    calibrated = mode in CALIBRATED
    if calibrated and (calibration_images is None or len(calibration_images) == 0):
        raise ExportError(f"{mode} needs calibration images (a representative sample of the training data).")
    with tempfile.TemporaryDirectory() as scratch:
        tf.saved_model.save(module, scratch, signatures={"serving_default": module.classify})
        converter = tf.lite.TFLiteConverter.from_saved_model(scratch)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if mode != "float32":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode == "float16":
            converter.target_spec.supported_types = [tf.float16]
        if calibrated:
            images = np.asarray(calibration_images, np.float32)
            converter.representative_dataset = lambda: ([image[None]] for image in images)
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.TFLITE_BUILTINS_INT8
                if mode != "int16x8"
                else tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
            ]
            converter.inference_input_type = converter.inference_output_type = tf.as_dtype(io_type)
            # Per-tensor Dense weights: per-channel ones store a float scale and an int64 zero
            # point per output channel (and for the bias), a third of a small ViT's int8 file
            # (digits model: 423 kB -> 358 kB, i.e. 34% -> 29% of float32, top-1 unchanged).
            converter._experimental_disable_per_channel_quantization_for_dense_layers = not per_channel_dense
        if mode == "int8-mixed":
            model_bytes = _quantize_except(converter, MIXED_FLOAT_OPS, tf.as_dtype(io_type), per_channel_dense)
        else:
            model_bytes = converter.convert()
    return symmetric_matmul_operands(model_bytes) if mode.startswith("int8") else model_bytes


def _quantize_except(converter, float_ops, io_dtype, per_channel_dense):
    """Full-integer quantisation of `converter`'s model (calibrated by it) that leaves the
    builtin ops named in `float_ops`, and LayerNorm's epsilon ADDs, in float32 (TFLite's
    selective quantisation, the quantisation debugger's `denylisted_ops` and
    `denylisted_nodes`; the converter itself has no public switch)."""
    from tensorflow.lite.python import convert as lite_convert

    converter._experimental_calibrate_only = True
    calibrated = converter.convert()
    return lite_convert.mlir_quantize(
        calibrated,
        input_data_type=io_dtype,
        output_data_type=io_dtype,
        denylisted_ops=list(float_ops),
        denylisted_nodes=[op.output for op in operators(calibrated) if _is_epsilon_add(op)],
        disable_per_channel_for_dense_layers=not per_channel_dense,
    )


def fold_requantize(model_bytes):
    """Replaces each DEQUANTIZE -> QUANTIZE pair (int8 -> float -> int8, which the converter
    leaves where a quantisation-aware model's input fake-quant range meets the calibrated
    input range) with one int8 -> int8 QUANTIZE, LiteRT's requantise. Same outputs."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    kinds = [max(code.builtinCode, code.deprecatedBuiltinCode) for code in model.operatorCodes]
    for graph in model.subgraphs:
        producer = {int(t): op for op in graph.operators for t in op.outputs}
        readers = {}
        for op in graph.operators:
            for t in op.inputs:
                readers[int(t)] = readers.get(int(t), 0) + 1
        dropped = []
        for op in graph.operators:
            source = producer.get(int(op.inputs[0]))
            if (
                kinds[op.opcodeIndex] == schema.BuiltinOperator.QUANTIZE
                and source is not None
                and kinds[source.opcodeIndex] == schema.BuiltinOperator.DEQUANTIZE
                and readers[int(op.inputs[0])] == 1
                and int(op.inputs[0]) not in graph.outputs
            ):
                op.inputs = [int(source.inputs[0])]
                dropped.append(source)
        graph.operators = [op for op in graph.operators if all(op is not d for d in dropped)]
    return _pack(model, len(model_bytes))


def _builtin_names(schema):
    """`{builtin operator code: name}` of the TFLite schema."""
    return {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}


def _pack(model, size):
    """Flatbuffer bytes of a `schema.ModelT`."""
    import flatbuffers

    builder = flatbuffers.Builder(size + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


# Ops whose int8 output shares its input's scale and zero point (the converter aligns them).
_SAME_PARAMS = (
    "RESHAPE",
    "TRANSPOSE",
    "UNPACK",
    "PACK",
    "SQUEEZE",
    "EXPAND_DIMS",
    "STRIDED_SLICE",
    "SLICE",
    "GATHER",
    "SPLIT",
    "SPLIT_V",
    "CONCATENATION",
)
# Ops that requantise their output, so any output scale/zero point is theirs to meet.
_REQUANTISING = ("FULLY_CONNECTED", "BATCH_MATMUL", "CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "SUB", "MUL")


def symmetric_matmul_operands(model_bytes):
    """Gives the right-hand int8 operand of every BATCH_MATMUL (attention's keys and values) a
    zero point of 0, widening its scale to cover the calibrated range.

    The XNNPACK delegate takes an int8 BATCH_MATMUL only when that operand is symmetric (seen
    with ai-edge-litert 2.3.0);
    otherwise LiteRT runs it on its builtin kernel, single-threaded: ViT-S/16's two attention
    matmuls then took about 3 ms per block, most of the full-int8 model's latency. The new
    parameters go to every tensor that shares them through shape-only ops (reshape, transpose,
    unpack, ...) back to the op that produced them; other int8 tensors are untouched."""
    from tensorflow.lite.python import schema_py_generated as schema

    names = _builtin_names(schema)
    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    kinds = [names[max(code.builtinCode, code.deprecatedBuiltinCode)] for code in model.operatorCodes]
    changed = False
    for graph in model.subgraphs:
        tensors = graph.tensors

        def params(t, tensors=tensors):
            q = tensors[t].quantization if t >= 0 else None
            if q is None or tensors[t].type != schema.TensorType.INT8 or q.scale is None or len(q.scale) != 1:
                return None
            return float(q.scale[0]), int(q.zeroPoint[0])

        parent = list(range(len(tensors)))

        def root(t, parent=parent):
            while parent[t] != t:
                parent[t] = parent[parent[t]]
                t = parent[t]
            return t

        producer = {}  # tensor -> kind of the op that sets its parameters ("linked": shares them)
        for op in graph.operators:
            kind = kinds[op.opcodeIndex]
            if op.inputs is None or len(op.inputs) == 0:
                continue
            data = list(op.inputs) if kind in ("PACK", "CONCATENATION") else [op.inputs[1 if kind == "SPLIT" else 0]]
            linked = [int(t) for t in data + list(op.outputs)]
            shared = kind in _SAME_PARAMS and params(linked[0]) is not None
            shared = shared and all(params(t) == params(linked[0]) for t in linked)
            for t in op.outputs:
                producer[int(t)] = "linked" if shared else kind
            for t in linked[1:] if shared else ():
                parent[root(t)] = root(linked[0])
        members = {}
        for t in range(len(tensors)):
            members.setdefault(root(t), []).append(t)
        boundary = {int(t) for t in list(graph.inputs) + list(graph.outputs)}
        for op in graph.operators:
            if kinds[op.opcodeIndex] != "BATCH_MATMUL" or len(op.inputs) < 2:
                continue
            group = members[root(int(op.inputs[1]))]
            current = params(group[0])
            sources = {producer.get(t) for t in group} - {"linked"}
            # Constants and graph inputs have no producer (None), so `sources` rules them out.
            if current is None or current[1] == 0 or boundary & set(group) or not sources <= set(_REQUANTISING):
                continue
            scale, zero = current
            symmetric = max((128 + zero) * scale, (127 - zero) * scale) / 127.0
            for t in group:
                tensors[t].quantization.scale, tensors[t].quantization.zeroPoint = [symmetric], [0]
            changed = True
    return _pack(model, len(model_bytes)) if changed else model_bytes


class Operator(NamedTuple):
    """One operator of a .tflite model, as `operators` lists it."""

    name: str  # builtin name (or the custom op's name)
    dtypes: tuple  # input tensor types, e.g. ("int8", "int32")
    at_input: bool  # reads a graph input
    at_output: bool  # writes a graph output
    output: str  # name of its first output tensor
    readers: tuple  # names of the operators that read its outputs


def operators(model_bytes):
    """An `Operator` for every operator of every subgraph, in order."""
    from tensorflow.lite.python import schema_py_generated as schema

    names = _builtin_names(schema)
    types = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    model = schema.Model.GetRootAs(model_bytes, 0)
    codes = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        custom = code.CustomCode()
        codes.append(custom.decode() if builtin == schema.BuiltinOperator.CUSTOM and custom else names[builtin])
    result = []
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        inputs, outputs = set(graph.InputsAsNumpy().tolist()), set(graph.OutputsAsNumpy().tolist())
        ops = []
        for o in range(graph.OperatorsLength()):
            op = graph.Operators(o)
            ins = [t for t in op.InputsAsNumpy().tolist() if t >= 0] if op.InputsLength() else []
            outs = op.OutputsAsNumpy().tolist() if op.OutputsLength() else []
            ops.append((codes[op.OpcodeIndex()], ins, outs))
        readers = {}
        for name, ins, _ in ops:
            for t in ins:
                readers.setdefault(t, []).append(name)
        for name, ins, outs in ops:
            result.append(
                Operator(
                    name,
                    tuple(types[graph.Tensors(t).Type()] for t in ins),
                    bool(inputs & set(ins)),
                    bool(outputs & set(outs)),
                    graph.Tensors(outs[0]).Name().decode() if outs else "",
                    tuple(r for t in outs for r in readers.get(t, ())),
                )
            )
    return result


def _is_epsilon_add(op):
    """Whether `op` is an ADD whose result only RSQRTs read: LayerNorm's `variance + epsilon`."""
    return op.name == "ADD" and set(op.readers) == {"RSQRT"}


def check_ops(model_bytes, mode):
    """Raises unless every operator is a builtin (no Flex/SELECT_TF_OPS, no custom op) and,
    for full-integer modes, no operator computes in float (only the QUANTIZE at a graph
    input and the DEQUANTIZE at a graph output may touch float; in int8-mixed also
    `MIXED_FLOAT_OPS`, LayerNorm's epsilon ADD and the QUANTIZEs back to int8). Returns the
    op names."""
    from tensorflow.lite.python import schema_py_generated as schema

    builtin = set(_builtin_names(schema).values()) - {"CUSTOM", "DELEGATE"}
    ops = operators(model_bytes)
    foreign = sorted({op.name for op in ops if op.name not in builtin})
    if foreign:
        raise ExportError(f"the {mode} model uses non-builtin ops {', '.join(foreign)} (not on stock LiteRT).")
    if mode in CALIBRATED:
        mixed = mode == "int8-mixed"
        allowed = MIXED_FLOAT_OPS + ("QUANTIZE",) if mixed else ()
        floating = sorted(
            {
                op.name
                for op in ops
                if any(d.startswith("float") for d in op.dtypes)
                and op.name not in allowed
                and not (mixed and _is_epsilon_add(op))
                and not (op.name == "QUANTIZE" and op.at_input)
                and not (op.name == "DEQUANTIZE" and op.at_output)
            }
        )
        if floating:
            raise ExportError(f"the {mode} model still computes in float in {', '.join(floating)}.")
    return sorted({op.name for op in ops})


class LiteRTModel:
    """A TFLite classifier on the `ai_edge_litert` interpreter: float pixels in, float
    probabilities out (quantised inputs/outputs converted with the tensor's parameters)."""

    def __init__(self, model_bytes, num_threads=2):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_content=bytes(model_bytes), num_threads=num_threads)
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]

    def _invoke(self, image):
        x = image[None].astype(np.float32)
        dtype = self.input["dtype"]
        if dtype != np.float32:
            scale, zero = self.input["quantization"]
            info = np.iinfo(dtype)
            x = np.clip(np.round(x / scale + zero), info.min, info.max).astype(dtype)
        self.interpreter.set_tensor(self.input["index"], x)
        self.interpreter.invoke()
        y = self.interpreter.get_tensor(self.output["index"])[0]
        if self.output["dtype"] != np.float32:
            scale, zero = self.output["quantization"]
            y = (y.astype(np.float32) - zero) * scale
        return y

    def undelegated_ops(self):
        """`{op name: count}` of the model's ops that the XNNPACK delegate (LiteRT's default on
        CPU) left to LiteRT's builtin kernels, which run single-threaded between its partitions."""
        # The interpreter lists the model's nodes, then one DELEGATE node per partition; a node
        # is delegated when it lies between a partition's inputs and its outputs.
        nodes = self.interpreter._get_ops_details()
        producer = {int(t): n["index"] for n in nodes if n["op_name"] != "DELEGATE" for t in n["outputs"]}
        delegated = set()
        for partition in (n for n in nodes if n["op_name"] == "DELEGATE"):
            inputs, pending = {int(t) for t in partition["inputs"]}, [int(t) for t in partition["outputs"]]
            while pending:
                node = producer.get(pending.pop())
                if node is not None and node not in delegated:
                    delegated.add(node)
                    pending += [int(t) for t in nodes[node]["inputs"] if t >= 0 and int(t) not in inputs]
        names = [n["op_name"] for n in nodes if n["op_name"] != "DELEGATE" and n["index"] not in delegated]
        return {name: names.count(name) for name in sorted(set(names))}

    def predict(self, images):
        """Probabilities `(N, classes)` of float/uint8 pixels `(N, H, W, C)`, one at a time."""
        return np.stack([self._invoke(image) for image in np.asarray(images)])

    def latency_ms(self, image, repeats=20, warmup=3):
        """Median batch-1 wall time of `invoke` in milliseconds."""
        from keras_vit.export.report import median_ms

        return median_ms(lambda: self._invoke(image), repeats, warmup)
