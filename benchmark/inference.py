"""Inference throughput: keras_vit and keras-hub through Keras (`predict_on_batch`, compiled
with XLA or as a TensorFlow graph) or as a frozen TensorFlow graph, timm through torch (eager,
and `torch.compile` with freezing); float32 and bfloat16; the batch already on the GPU where
there is one."""

import functools

import numpy as np

from keras_vit.benchmark import accelerator, models
from keras_vit.benchmark.kernels import profiled
from keras_vit.benchmark.timing import rate, seconds, throughput_rows


def timm_step(module, images, mode):
    """A zero-argument forward of a timm module on `images` (NHWC, 0-255), on the GPU when
    torch sees one. `mode`: "eager", "compile" (torch.compile after freezing: inference
    graph, constants folded), "eager_bf16" or "compile_bf16" (autocast to bfloat16)."""
    import torch

    device = accelerator.torch_device()
    batch = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2) / 255.0, dtype="float32")).to(device)
    module = module.eval().to(device)
    forward = module
    if mode.startswith("compile"):
        import torch._inductor.config as inductor

        inductor.freezing = True
        forward = torch.compile(module)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=mode.endswith("bf16"))

    def step():
        with torch.inference_mode(), autocast:
            logits = forward(batch)
        accelerator.synchronize(device)
        return logits

    return step


def keras_forward(model, compiler, batch):
    """`(step, predict)` of a Keras model: `step()` one forward of `batch`, `predict(images,
    batch_size)` float32 logits. `compiler`: "xla" or "graph" (Keras's `jit_compile`),
    "stateless" (JAX only, see `_stateless_forward`) or "frozen" (TensorFlow only: the graph
    with the weights as constants, as `keras-vit export --freeze` serves it;
    `keras_vit.export.freeze`)."""
    if compiler == "stateless":
        return _stateless_forward(model, batch)
    if compiler != "frozen":
        model.compile(jit_compile=compiler == "xla")
        return functools.partial(model.predict_on_batch, batch), functools.partial(model.predict, verbose=0)
    import keras

    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"the frozen mode needs the TensorFlow backend, not {keras.backend.backend()}.")
    from keras_vit.export.frozen import freeze

    forward = freeze(model)
    return (lambda: forward(batch).numpy()), _batched(lambda images: forward(images).numpy())


def _stateless_forward(model, batch):
    """`jax.jit` of `model.stateless_call` with the weights as arguments: how a JAX program
    serves a Keras model, the logits left on the device. `predict_on_batch` adds a walk over the
    weights and the logits' copy to the host (keras-hub's, Keras's own, also a read and a write
    back of every variable: 2.0-2.7 ms per call on the H100 machine's host; docs/performance.md)."""
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError(f"the stateless mode needs the JAX backend, not {keras.backend.backend()}.")
    import jax

    weights = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
    forward = jax.jit(lambda weights, images: model.stateless_call(*weights, images, training=False)[0])
    # the step waits for the GPU and leaves the logits there, as timm's does
    return (lambda: forward(weights, batch).block_until_ready()), _batched(lambda x: np.asarray(forward(weights, x)))


def _batched(forward):
    """`predict(images, batch_size)`: float32 logits of `forward` (a batch -> NumPy) over `images`
    in batches."""

    def predict(images, batch_size):
        parts = [forward(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]
        return np.concatenate(parts).astype("float32")

    return predict


def agreement(a, b):
    """Share of rows whose top-1 class is the same."""
    return float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))


def run_case(case, against, repeats, log, peak_probe=None, profile=None):
    """Throughput of every implementation on one inference case; a list of result rows (with
    their share of the FMA peak where `peak_probe` is given: `timing.throughput_rows`, and
    their oneDNN kernels where `profile` is: `kernels.Profiler`)."""
    import keras

    keras.utils.set_random_seed(0)  # the same random weights in every run
    config = models.config_for(case["model"])
    batch = case["batch"]
    rng = np.random.default_rng(0)
    # top-1 agreement is counted on `agreement_images` images (default: the timed batch)
    pool = rng.uniform(0, 255, (max(batch, case.get("agreement_images", batch)),) + tuple(config.image_size) + (3,))
    pool = pool.astype("float32")
    images = pool[:batch]
    on_device = keras.ops.convert_to_tensor(images)  # on the GPU if there is one, as timm's batch is
    flops = models.forward_flops(config) * batch
    against = [a for a in against if a in case.get("against", against)]  # a case may compare with fewer
    rows, steps, source, reference = [], [], None, None
    for implementation in ("keras_vit",) + tuple(a for a in against if a != "timm"):
        ours = implementation == "keras_vit"
        build = models.build_keras_vit if ours else models.build_keras_hub
        for dtype in case["dtypes"]:
            for compiler in case.get("compilers", ("xla",)):
                model = build(config, dtype=dtype)
                # keras_vit: the same weights in every mode (a random head too), so agreement means something
                if ours and source is None:
                    source = random_head(model)
                elif ours:
                    model.set_weights(source.get_weights())
                step, predict = keras_forward(model, compiler, on_device)
                row = dict(
                    case=case["name"],
                    implementation=implementation,
                    mode=dtype,
                    compiler=compiler,
                    first_call_s=seconds(step)[0],
                )
                if ours and dtype == "float32" and reference is None:
                    reference = predict(pool, batch)
                elif ours and dtype != "float32" and reference is not None:
                    logits = predict(pool, batch)
                    row["agreement_with_float32"] = agreement(logits, reference)
                    row["agreement_images"] = len(pool)
                    # random weights leave near-ties among 1000 classes: the logit error tells how near
                    row["max_logit_error"] = float(np.max(np.abs(logits - reference)))
                    row["near_ties"] = float(np.mean(near_ties(reference, row["max_logit_error"])))
                rows.append(row)
                steps.append(step)
    if "timm" in against:
        module = models.build_timm(config)
        for mode in case["timm_modes"]:
            step = timm_step(module, images, mode)
            rows.append(dict(case=case["name"], implementation="timm", mode=mode, first_call_s=seconds(step)[0]))
            steps.append(step)
    # every model stays loaded and is timed in rounds, so the ratios between them are fair
    measures = [functools.partial(rate, step, batch) for step in steps]
    rows = throughput_rows(rows, measures, repeats, flops / batch / 1e9, log, peak_probe=peak_probe)
    return profiled(rows, measures, case, profile)


def near_ties(logits, error):
    """Per row of `logits`, whether its top-2 gap is under twice `error`: only such rows can
    change their top-1 class when every logit moves by at most `error`."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0] < 2 * error


def random_head(model):
    """The head starts at zero (the paper's init), which makes every class tie; give it
    random weights so top-1 agreement between precisions is a real comparison."""
    head = model.get_layer("head")
    kernel = np.random.default_rng(1).normal(0, 0.02, head.kernel.shape)
    head.kernel.assign(kernel.astype(head.kernel.dtype))
    return model
