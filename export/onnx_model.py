"""ONNX files of a classifier: converted by tf2onnx from the same TensorFlow function as the
LiteRT files (with any batch), its layer norms and GELUs rewritten to the forms ONNX Runtime runs
as one kernel (`onnx_graph`), quantised by onnxruntime (dynamic, or static from calibration
images), standard ONNX ops only, the model's metadata in `metadata_props`; and a runner on ONNX
Runtime's CPU provider."""

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

from keras_vit.export import onnx_graph
from keras_vit.export.source import ExportError, require_packages
from keras_vit.names import ONNX_MODES as MODES

INSTALL_HINT = 'pip install "keras3-vit[onnx]"'
CALIBRATED = ("int8",)
# ONNX Runtime 1.11 on, OpenVINO and TensorRT read opset 17.
OPSET = 17
_STANDARD_DOMAINS = ("", "ai.onnx")
_CATCH_ERRORS = "TF2ONNX_CATCH_ERRORS"  # tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS


def check_installed(converting=True):
    """Raises an ExportError naming the extra when onnxruntime (and, `converting`, onnx and
    tf2onnx) is missing."""
    wanted = ("onnx", "onnxruntime", "tf2onnx") if converting else ("onnxruntime",)
    require_packages("ONNX files", wanted, INSTALL_HINT)


def _erfc(ctx, node, name, args):
    """tf2onnx handler of TensorFlow's Erfc (exact GELU is `0.5 x erfc(-x / sqrt 2)`), which ONNX
    lacks: `1 - Erf(x)`."""
    import tf2onnx

    erf = ctx.make_node("Erf", [node.input[0]])
    one = ctx.make_const(tf2onnx.utils.make_name(f"{name}_one"), np.array(1, np.float32))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def convert(module, properties):
    """The float32 ONNX model (bytes) of `module` (a `ClassifierModule` with any batch):
    input `image` `(batch, H, W, C)` float pixels in [0, 255], output `probability`; `properties`
    (str -> str) go into its metadata_props."""
    import logging

    import tf2onnx

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)  # its per-op notices
    with _lean_tf2onnx():
        proto, _ = tf2onnx.convert.from_function(
            module.classify,
            input_signature=module.classify.input_signature,
            opset=OPSET,
            custom_op_handlers={"Erfc": (_erfc, [])},
        )
    proto, _, _ = onnx_graph.fuse(proto)  # layer norms and GELUs in the forms ONNX Runtime fuses
    return with_properties(proto.SerializeToString(), properties)


@contextlib.contextmanager
def _lean_tf2onnx():
    """tf2onnx's conversion without its two copies of the weights per optimiser pass (ViT-S/16:
    peak 4.5 GB above the model without this, about 24 passes of 84 MB):

    - It deep-copies the whole graph before each optimiser so that it can skip one that fails;
      the copies are cyclic garbage that piles up until Python collects it. Without them a
      failing optimiser raises, as the conversion's tests would show.
    - Each pass rewrites every node's attributes into its NodeProto; protobuf's upb runtime
      keeps the replaced attributes in the message's arena, so each pass adds a copy of every
      constant. Each node gets a fresh NodeProto instead (the attributes are rebuilt from the
      node's own dict anyway), and the old arena is freed."""
    from tf2onnx import graph

    original = graph.Node.update_proto

    def update_proto(node, external_tensor_storage=None):
        fresh = type(node.op)()
        for field, value in node.op.ListFields():
            if field.name == "attribute":
                continue
            if field.is_repeated:
                getattr(fresh, field.name).extend(value)
            elif field.type == field.TYPE_MESSAGE:
                getattr(fresh, field.name).CopyFrom(value)
            else:
                setattr(fresh, field.name, value)
        node._op = fresh
        original(node, external_tensor_storage)

    previous = os.environ.get(_CATCH_ERRORS)
    os.environ[_CATCH_ERRORS] = "FALSE"
    graph.Node.update_proto = update_proto
    try:
        yield
    finally:
        graph.Node.update_proto = original
        if previous is None:
            del os.environ[_CATCH_ERRORS]
        else:
            os.environ[_CATCH_ERRORS] = previous


def with_properties(model_bytes, properties):
    """`model_bytes` with `properties` as its metadata_props (replacing those of the same keys)."""
    import onnx

    proto = onnx.load_from_string(model_bytes)
    kept = [p for p in proto.metadata_props if p.key not in properties]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in properties.items():
        proto.metadata_props.add(key=key, value=value)
    proto.producer_name = "keras-vit"
    return proto.SerializeToString()


def properties(model_bytes):
    """The metadata_props of an ONNX model, as a dict."""
    import onnx

    return {p.key: p.value for p in onnx.load_from_string(model_bytes).metadata_props}


def quantize(float_bytes, mode, calibration_images=None):
    """The `mode` file (bytes) of the float32 model `float_bytes`: "float32" as it is; "dynamic":
    int8 weights, activations quantised at run time per call (MatMulInteger); "int8": int8 weights
    and activations calibrated on `calibration_images` (QuantizeLinear/DequantizeLinear pairs,
    per-tensor, as the LiteRT int8 file). Metadata kept."""
    if mode not in MODES:
        raise ExportError(f"unknown ONNX mode {mode!r}; choose from {', '.join(MODES)}.")
    if mode == "float32":
        return float_bytes
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
        shape_inference,
    )

    with tempfile.TemporaryDirectory() as scratch:
        source, target = Path(scratch) / "float32.onnx", Path(scratch) / f"{mode}.onnx"
        source.write_bytes(float_bytes)
        prepared = Path(scratch) / "prepared.onnx"
        shape_inference.quant_pre_process(source, prepared)  # shapes and folded constants, as onnxruntime advises
        if mode == "dynamic":
            quantize_dynamic(prepared, target, weight_type=QuantType.QInt8)
        else:
            if calibration_images is None or len(calibration_images) == 0:
                raise ExportError("the ONNX int8 mode needs calibration images (a sample of the training data).")

            class Images(CalibrationDataReader):
                def __init__(self):
                    self._images = iter(np.asarray(calibration_images, np.float32))

                def get_next(self):
                    image = next(self._images, None)
                    return None if image is None else {"image": image[None]}

            quantize_static(
                prepared,
                target,
                Images(),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
            )
        return with_properties(target.read_bytes(), properties(float_bytes))


def check_ops(model_bytes, mode):
    """Raises unless every node is a standard ONNX op (no onnxruntime contrib or custom domain);
    returns the op types."""
    import onnx

    graph = onnx.load_from_string(model_bytes).graph
    foreign = sorted({f"{n.domain}.{n.op_type}" for n in graph.node if n.domain not in _STANDARD_DOMAINS})
    if foreign:
        raise ExportError(f"the ONNX {mode} model uses non-standard ops {', '.join(foreign)}.")
    return sorted({n.op_type for n in graph.node})


class OnnxModel:
    """An ONNX classifier on ONNX Runtime's CPU provider: float pixels `(N, H, W, C)` in,
    probabilities out, `threads` intra-op threads."""

    def __init__(self, model_bytes, num_threads=2):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = num_threads, 1
        options.log_severity_level = 3  # errors only
        self.session = ort.InferenceSession(bytes(model_bytes), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0]
        self.properties = dict(self.session.get_modelmeta().custom_metadata_map)
        self.input_shape = tuple(self.input.shape[1:])  # (H, W, C)

    def predict(self, images, batch_size=64):
        images = np.asarray(images, np.float32)
        return np.concatenate(
            [
                self.session.run(None, {self.input.name: images[i : i + batch_size]})[0]
                for i in range(0, len(images), batch_size)
            ]
        )
