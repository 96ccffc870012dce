"""Training throughput: `model.fit` with AdamW for keras_vit and keras-hub, a torch AdamW
loop for timm; images/s after warm-up, and the wall time of the first step."""

import time

import numpy as np

from keras_vit.benchmark import models
from keras_vit.benchmark.timing import median_rate


def keras_training(model, batch, repeats, steps_per_repeat, jit_compile=True):
    """(median images/s, seconds until the first step ended) of `model.fit`."""
    import keras

    warmup = 2
    steps = warmup + repeats * steps_per_repeat
    config_shape = tuple(model.inputs[0].shape[1:])
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (batch,) + config_shape).astype("float32")
    y = rng.integers(0, model.outputs[0].shape[-1], batch)
    # One batch repeated: the first step is the trace/compile and one step, without converting
    # a whole epoch of arrays first. tf.data where TensorFlow is installed (keras-hub's `fit`
    # takes no generators), a generator on JAX-only machines.
    try:
        import tensorflow as tf

        data = tf.data.Dataset.from_tensors((x, y)).repeat(steps)
    except ImportError:
        data = ((x, y) for _ in range(steps))
    model.compile(optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile)  # fmt: skip
    model.optimizer.build(model.trainable_variables)  # as the training app does: one trace of the first step
    ends = []
    timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_, **__: ends.append(time.perf_counter()))
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
    first = ends[0] - start
    rates = [batch * steps_per_repeat / (ends[i + steps_per_repeat] - ends[i])
             for i in range(warmup - 1, steps - steps_per_repeat, steps_per_repeat)]  # fmt: skip
    return float(np.median(rates)), first


def timm_training(module, config, batch, repeats, steps_per_repeat, mode):
    """(median images/s, seconds of the first step) of a torch AdamW loop on a timm module;
    `mode` is "eager", "compile", "eager_bf16" or "compile_bf16"."""
    import torch

    module = module.train()
    forward = torch.compile(module) if mode.startswith("compile") else module
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, weight_decay=0.05)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.uniform(0, 1, (batch, config.channels) + tuple(config.image_size)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, config.num_classes, batch))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode.endswith("bf16"))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start

    def repeat():
        for _ in range(steps_per_repeat):
            step()

    rate, _ = median_rate(repeat, batch * steps_per_repeat, repeats)
    return rate, first


def run_case(case, against, repeats, log):
    """Training throughput of every implementation on one case; a list of result rows."""
    config = models.config_for(case["model"])
    batch, steps = case["batch"], case["steps_per_repeat"]
    flops = 3 * models.forward_flops(config)  # forward + backward (2x forward)
    rows = []

    def add(implementation, mode, rate, first, compiler=None):
        row = dict(case=case["name"], implementation=implementation, mode=mode, images_per_s=rate,
                   first_step_s=first, gflops_per_s=flops * rate / 1e9)  # fmt: skip
        if compiler is not None:
            row["compiler"] = compiler
        rows.append(row)
        log(row)

    for implementation in ("keras_vit",) + tuple(a for a in against if a != "timm"):
        build = models.build_keras_vit if implementation == "keras_vit" else models.build_keras_hub
        for dtype in case["dtypes"]:
            for compiler in case.get("compilers", ("xla",)):
                model = build(config, dtype=dtype)
                rate, first = keras_training(model, batch, repeats, steps, jit_compile=compiler == "xla")
                add(implementation, dtype, rate, first, compiler)
    if "timm" in against:
        for mode in case["timm_modes"]:
            add("timm", mode, *timm_training(models.build_timm(config), config, batch, repeats, steps, mode))
    return rows
