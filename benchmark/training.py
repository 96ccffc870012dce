"""Training throughput: `model.fit` with AdamW for keras_vit and keras-hub, a torch AdamW
loop for timm; images/s after warm-up, and the wall time of the first step."""

import functools
import time

import numpy as np

from keras_vit.benchmark import accelerator, models
from keras_vit.benchmark.kernels import profiled
from keras_vit.benchmark.timing import rate, seconds, throughput_rows


def adamw(implementation):
    """The AdamW that each toolkit's users train with: keras_vit.training's `FusedAdamW` for
    keras_vit on the TensorFlow backend, Keras's own elsewhere (keras-hub ships none)."""
    import keras

    if implementation == "keras_vit" and keras.backend.backend() == "tensorflow":
        from keras_vit.training.optimizers import FusedAdamW

        return FusedAdamW(1e-4, weight_decay=0.05)
    return keras.optimizers.AdamW(1e-4, weight_decay=0.05)


def keras_training(model, batch, steps_per_repeat, optimizer, jit_compile=True):
    """(seconds until the first `model.fit` step ended, measure): `measure()` runs `model.fit`
    with `optimizer` for `steps_per_repeat` + 1 steps and returns the images/s from the end of
    its first step to the end of its last (the data iterator's set-up is left out)."""
    import keras

    config_shape = tuple(model.inputs[0].shape[1:])
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (batch,) + config_shape).astype("float32")
    y = rng.integers(0, model.outputs[0].shape[-1], batch)
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile
    )
    model.optimizer.build(model.trainable_variables)  # as the training app does: one trace of the first step
    # One batch repeated: the first step is the trace/compile and one step, without converting
    # a whole epoch of arrays first. tf.data where TensorFlow is installed, else a generator of
    # the batch already on the device (on a GPU, as timm's is) through Keras's own `fit`:
    # keras-hub's `fit` maps its preprocessor (None here) with tf.data or grain, and takes no
    # generators.
    try:
        import tensorflow as tf

        batches, run_fit = (lambda steps: tf.data.Dataset.from_tensors((x, y)).repeat(steps)), model.fit
    except ImportError:
        on_device = tuple(map(keras.ops.convert_to_tensor, (x, y)))
        batches, run_fit = (lambda steps: (on_device for _ in range(steps))), functools.partial(keras.Model.fit, model)

    def fit(steps):
        data = batches(steps)
        ends = []
        timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_, **__: ends.append(time.perf_counter()))
        start = time.perf_counter()
        run_fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer], shuffle=False)
        return start, ends

    def measure():
        ends = fit(steps_per_repeat + 1)[1]
        return batch * steps_per_repeat / (ends[-1] - ends[0])

    start, ends = fit(2)  # the first step, and one more before timing
    return ends[0] - start, measure


def timm_training(module, config, batch, steps_per_repeat, mode):
    """(seconds of the first step, measure) of a torch AdamW loop on a timm module, on the GPU
    when torch sees one: `measure()` times `steps_per_repeat` steps and returns images/s.
    `mode` is "eager", "compile", "eager_bf16" or "compile_bf16"."""
    import torch

    device = accelerator.torch_device()
    module = module.train().to(device)
    forward = torch.compile(module) if mode.startswith("compile") else module
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, weight_decay=0.05)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.uniform(0, 1, (batch, config.channels) + tuple(config.image_size)).astype("float32"))
    x, y = x.to(device), torch.from_numpy(rng.integers(0, config.num_classes, batch)).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=mode.endswith("bf16"))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        accelerator.synchronize(device)

    first, _ = seconds(step)
    step()  # one more before timing, as for Keras

    def repeat():
        for _ in range(steps_per_repeat):
            step()

    return first, functools.partial(rate, repeat, batch * steps_per_repeat)


def run_case(case, against, repeats, log, peak_probe=None, profile=None):
    """Training throughput of every implementation on one case; a list of result rows (with
    their share of the FMA peak where `peak_probe` is given: `timing.throughput_rows`, and
    their oneDNN kernels where `profile` is: `kernels.Profiler`)."""
    config = models.config_for(case["model"])
    batch, steps = case["batch"], case["steps_per_repeat"]
    flops = 3 * models.forward_flops(config)  # forward + backward (2x forward)
    rows, measures = [], []

    def add(implementation, mode, first, measure, compiler=None, optimizer="torch AdamW"):
        rows.append(
            dict(case=case["name"], implementation=implementation, mode=mode, first_step_s=first, optimizer=optimizer)
        )
        if compiler is not None:
            rows[-1]["compiler"] = compiler
        measures.append(measure)

    for implementation in ("keras_vit",) + tuple(a for a in against if a != "timm"):
        build = models.build_keras_vit if implementation == "keras_vit" else models.build_keras_hub
        for dtype in case["dtypes"]:
            for compiler in case.get("compilers", ("xla",)):
                model, optimizer = build(config, dtype=dtype), adamw(implementation)
                add(
                    implementation,
                    dtype,
                    *keras_training(model, batch, steps, optimizer, jit_compile=compiler == "xla"),
                    compiler,
                    type(optimizer).__name__,
                )
    if "timm" in against:
        for mode in case["timm_modes"]:
            add("timm", mode, *timm_training(models.build_timm(config), config, batch, steps, mode))
    # every model stays built and is timed in rounds, so the ratios between them are fair
    rows = throughput_rows(rows, measures, repeats, flops / 1e9, log, warmup=0, peak_probe=peak_probe)
    return profiled(rows, measures, case, profile)
