"""LiteRT batch-1 latency of the export modes (TensorFlow backend: the converter needs it)."""

import numpy as np

from keras_vit.benchmark import models


def run_case(case, against, repeats, log, threads=2):
    """Size, median batch-1 latency and the ops XNNPACK left to LiteRT's builtin kernels of
    each mode's .tflite file of the case's model (random weights, calibrated on random images
    for the full-integer modes)."""
    from keras_vit.export import litert

    config = models.config_for(case["model"])
    model = models.build_keras_vit(config)
    rng = np.random.default_rng(0)
    calibration = rng.uniform(0, 255, (8,) + tuple(config.image_size) + (3,)).astype("float32")
    module = litert.keras_module(model)
    rows = []
    for mode in case["modes"]:
        model_bytes = litert.convert(module, mode, calibration_images=calibration if mode in litert.CALIBRATED else None)
        litert.check_ops(model_bytes, mode)
        runner = litert.LiteRTModel(model_bytes, num_threads=threads)
        latency = runner.latency_ms(calibration[0], repeats=max(repeats, 5) * 4)
        left = runner.undelegated_ops()
        row = dict(case=case["name"], implementation="keras_vit", mode=mode, latency_ms=latency,
                   size_kb=len(model_bytes) / 1024, undelegated_ops=", ".join(f"{k} x{n}" for k, n in left.items()))  # fmt: skip
        rows.append(row)
        log(row)
    return rows
