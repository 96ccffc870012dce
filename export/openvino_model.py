"""OpenVINO IR files of a classifier (`NAME_MODE.xml` with its `.bin` weights), converted by
OpenVINO from the ONNX graph of the same TensorFlow function as the LiteRT files (with any batch;
`onnx_model.convert`, whose layer norms and GELUs OpenVINO fuses: ViT-S/16 at batch 32 ran 8%
faster in f32 and 23% in bf16 than converted from the TensorFlow function), float32 weights, the
model's metadata and the CPU inference precision they are run in under rt_info `keras_vit`; and a
runner on OpenVINO's CPU plugin in that precision."""

import tempfile
from pathlib import Path

import numpy as np

from keras_vit.export.source import ExportError, require_packages
from keras_vit.names import OPENVINO_MODES as MODES

INSTALL_HINT = 'pip install "keras3-vit[openvino]"'
RT_INFO = "keras_vit"  # rt_info section of the model's properties (metadata.model_properties)
PRECISION_KEY = "inference_precision"  # in that section: the precision the file is run in
# OpenVINO's names of the modes' CPU inference precisions (INFERENCE_PRECISION_HINT). The CPU
# plugin's own default on CPUs with AVX512_BF16 or AMX is bf16, so the float32 file needs its "f32".
PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}


def check_installed(converting=True):
    """Raises an ExportError naming the extra when openvino (and, `converting`, onnx and tf2onnx)
    is missing."""
    wanted = ("openvino", "onnx", "tf2onnx") if converting else ("openvino",)
    require_packages("OpenVINO files", wanted, INSTALL_HINT)


def cpu_modes():
    """The modes this machine's CPU runs natively: bfloat16 only where OpenVINO finds BF16."""
    import openvino as ov

    capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return tuple(mode for mode in MODES if mode == "float32" or "BF16" in capabilities)


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


def save(model, path, mode, properties):
    """Writes `model` (from `convert`) to `path` (.xml) and its `.bin`, with `properties` (str ->
    str) and the mode's precision in rt_info. Returns the two paths."""
    import openvino as ov

    if mode not in MODES:
        raise ExportError(f"unknown OpenVINO mode {mode!r}; choose from {', '.join(MODES)}.")
    for key, value in {**properties, PRECISION_KEY: PRECISIONS[mode]}.items():
        model.set_rt_info(value, [RT_INFO, key])
    path = Path(path)
    ov.save_model(model, path, compress_to_fp16=False)
    return path, path.with_suffix(".bin")


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
