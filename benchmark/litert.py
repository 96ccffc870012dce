"""LiteRT batch-1 latency of the export modes, beside ONNX Runtime's on the ONNX files of the same
model, mode for mode (TensorFlow backend: the converters need it)."""

import functools
import importlib.util

import numpy as np

from keras_vit.benchmark import models
from keras_vit.benchmark.timing import interleaved_rounds, median_and_spread


def run_case(case, against, repeats, log, threads=2):
    """Size, median batch-1 latency and the ops XNNPACK left to LiteRT's builtin kernels of
    each mode's .tflite file of the case's model (random weights, calibrated on random images
    for the full-integer modes). The files are timed in rounds, a few invokes each, like the
    other cases' contenders. The case's `onnx_modes` (where onnxruntime is installed) add rows of
    implementation "onnxruntime" for those modes' .onnx files, timed in the same rounds."""
    from keras_vit.export import litert

    config = models.config_for(case["model"])
    model = models.build_keras_vit(config)
    rng = np.random.default_rng(0)
    calibration = rng.uniform(0, 255, (8,) + tuple(config.image_size) + (3,)).astype("float32")
    module = litert.keras_module(model)
    rows, runners = [], []
    for mode in case["modes"]:
        model_bytes = litert.convert(
            module, mode, calibration_images=calibration if mode in litert.CALIBRATED else None
        )
        litert.check_ops(model_bytes, mode)
        runners.append(litert.LiteRTModel(model_bytes, num_threads=threads))
        left = runners[-1].undelegated_ops()
        rows.append(
            dict(
                case=case["name"],
                implementation="keras_vit",
                mode=mode,
                size_kb=len(model_bytes) / 1024,
                undelegated_ops=", ".join(f"{k} x{n}" for k, n in left.items()),
            )
        )
    measures = [functools.partial(runner.latency_ms, calibration[0], repeats=4, warmup=1) for runner in runners]
    if case.get("onnx_modes") and importlib.util.find_spec("onnxruntime") is not None:
        onnx_rows, onnx_measures = _onnx(model, case, calibration, threads)
        rows, measures = rows + onnx_rows, measures + onnx_measures
    for row, latencies in zip(rows, interleaved_rounds(measures, 2 * max(repeats, 5))):
        latency, spread = median_and_spread(latencies)
        row.update(latency_ms=latency, spread=spread)
        log(row)
    return rows


def _onnx(model, case, calibration, threads):
    """Rows and batch-1 latency measures of the case's ONNX modes on ONNX Runtime's CPU provider."""
    from keras_vit.export import litert, onnx_model, report

    float_bytes = onnx_model.convert(litert.keras_module(model, batch=None), {})
    rows, measures, one = [], [], calibration[:1]
    for mode in case["onnx_modes"]:
        model_bytes = onnx_model.quantize(float_bytes, mode, calibration)
        runner = onnx_model.OnnxModel(model_bytes, num_threads=threads)
        measures.append(functools.partial(report.median_ms, lambda runner=runner: runner.predict(one), 4, 1))
        rows.append(dict(case=case["name"], implementation="onnxruntime", mode=mode, size_kb=len(model_bytes) / 1024))
    return rows, measures
