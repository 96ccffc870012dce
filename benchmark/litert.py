"""LiteRT batch-1 latency of the export modes (TensorFlow backend: the converter needs it)."""

import functools

import numpy as np

from keras_vit.benchmark import models
from keras_vit.benchmark.timing import interleaved_rounds, median_and_spread


def run_case(case, against, repeats, log, threads=2):
    """Size, median batch-1 latency and the ops XNNPACK left to LiteRT's builtin kernels of
    each mode's .tflite file of the case's model (random weights, calibrated on random images
    for the full-integer modes). The files are timed in rounds, a few invokes each, like the
    other cases' contenders."""
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
    for row, latencies in zip(rows, interleaved_rounds(measures, 2 * max(repeats, 5))):
        latency, spread = median_and_spread(latencies)
        row.update(latency_ms=latency, spread=spread)
        log(row)
    return rows
