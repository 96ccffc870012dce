"""OpenVINO IR files of a classifier (`NAME_MODE.xml` with its `.bin` weights), converted by
OpenVINO from the ONNX graph of the same TensorFlow function as the LiteRT files (with any batch;
`onnx_model.convert`, whose layer norms and GELUs OpenVINO fuses: ViT-S/16 at batch 32 ran 8%
faster in f32 and 23% in bf16 than converted from the TensorFlow function), float32 weights, the
model's metadata and the CPU inference precision they are run in under rt_info `keras_vit`; and a
runner on OpenVINO's CPU plugin in that precision. The int8 file is NNCF's post-training
quantisation of the same graph (int8 weights and activations, calibrated on training images, the
rest of the graph in float32)."""

import contextlib
import io
import logging
import tempfile
from pathlib import Path

import numpy as np

from keras_vit.export.source import ExportError, require_packages
from keras_vit.names import OPENVINO_MODES as MODES

INSTALL_HINT = 'pip install "keras3-vit[openvino]"'
RT_INFO = "keras_vit"  # rt_info section of the model's properties (metadata.model_properties)
PRECISION_KEY = "inference_precision"  # in that section: the precision the file is run in
# OpenVINO's names of the modes' CPU inference precisions (INFERENCE_PRECISION_HINT). The CPU
# plugin's own default on CPUs with AVX512_BF16 or AMX is bf16, so the float32 file needs its "f32";
# the int8 file's unquantised ops (softmax, layer norms, the head) run in float32 on every CPU.
PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "int8": "f32"}


def check_installed(converting=True, quantizing=False):
    """Raises an ExportError naming the extra when openvino (and, `converting`, onnx and tf2onnx;
    `quantizing`, nncf) is missing."""
    wanted = ("openvino", "onnx", "tf2onnx") if converting else ("openvino",)
    require_packages("OpenVINO files", wanted + (("nncf",) if quantizing else ()), INSTALL_HINT)


def cpu_modes():
    """The precisions this machine's CPU runs natively: float32, and bfloat16 only where OpenVINO
    finds BF16 (int8, a quantised file, runs on every CPU)."""
    import openvino as ov

    capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return tuple(mode for mode in MODES if mode == "float32" or (mode == "bfloat16" and "BF16" in capabilities))


def convert(module=None, onnx_bytes=None):
    """The OpenVINO model (`openvino.Model`) of `module` (a `ClassifierModule` with any batch),
    converted from its ONNX graph (`onnx_model.convert`), or of the float32 ONNX model
    `onnx_bytes`: input `image` `(batch, H, W, C)` float pixels in [0, 255], output
    `probability`. One conversion serves every mode (`save`)."""
    import openvino as ov

    from keras_vit.export import onnx_model

    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "model.onnx"
        source.write_bytes(onnx_bytes if onnx_bytes is not None else onnx_model.convert(module, {}))
        return ov.convert_model(source)


def save(model, path, mode, properties, calibration_images=None):
    """Writes `model` (from `convert`) to `path` (.xml) and its `.bin`, with `properties` (str ->
    str) and the mode's precision in rt_info; "int8" quantised first by NNCF on
    `calibration_images` (`quantize`). Returns the two paths."""
    import openvino as ov

    if mode not in MODES:
        raise ExportError(f"unknown OpenVINO mode {mode!r}; choose from {', '.join(MODES)}.")
    if mode == "int8":
        model = quantize(model, calibration_images)
    for key, value in {**properties, PRECISION_KEY: PRECISIONS[mode]}.items():
        model.set_rt_info(value, [RT_INFO, key])
    path = Path(path)
    ov.save_model(model, path, compress_to_fp16=False)
    return path, path.with_suffix(".bin")


def quantize(model, calibration_images):
    """NNCF's int8 copy of `model` (from `convert`; left as it is): int8 weights and activations
    of the matmuls, calibrated on `calibration_images` (float pixels `(N, H, W, C)`, one image
    per calibration step), with NNCF's transformer scheme (SmoothQuant on the matmuls' inputs,
    softmax and layer norms left in float)."""
    if calibration_images is None or len(calibration_images) == 0:
        raise ExportError("the OpenVINO int8 mode needs calibration images (a sample of the training data).")
    import nncf

    images = np.asarray(calibration_images, np.float32)
    dataset = nncf.Dataset([image[None] for image in images])
    with _quiet_nncf():
        return nncf.quantize(model.clone(), dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(images))


@contextlib.contextmanager
def _quiet_nncf():
    """NNCF's progress bars (rich, on standard output) and INFO lines held back: the export
    reports its own progress, and a command's standard output is its result."""
    from nncf.common.logging import nncf_logger

    level = nncf_logger.level
    nncf_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        nncf_logger.setLevel(level)


class OpenVINOModel:
    """An OpenVINO IR classifier (the .xml path) compiled for the CPU in the precision it records
    (float32 for files without the record): float pixels `(N, H, W, C)` in, probabilities out."""

    def __init__(self, path, num_threads=2):
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        keys = list(dict(model.get_rt_info()).get(RT_INFO, {}))
        self.properties = {key: model.get_rt_info([RT_INFO, key]).astype(str) for key in keys}
        self.precision = self.properties.pop(PRECISION_KEY, PRECISIONS["float32"])
        config = {"INFERENCE_PRECISION_HINT": self.precision, "INFERENCE_NUM_THREADS": num_threads}
        self.compiled = core.compile_model(model, "CPU", config)
        self.input_shape = tuple(int(d) for d in model.inputs[0].get_partial_shape()[1:].to_shape())

    def predict(self, images, batch_size=64):
        images = np.asarray(images, np.float32)
        return np.concatenate([self.compiled(images[i : i + batch_size])[0] for i in range(0, len(images), batch_size)])
