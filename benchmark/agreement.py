"""bfloat16 against float32 on a trained model: the digits default (`keras-vit train` with no
options: scikit-learn's bundled digits, offline) trained in float32, then its held-out digits
classified by the float32 model and by a `mixed_bfloat16` copy with the same weights, in each
Keras serving mode. On random weights the logits of many images nearly tie and flip under bf16
rounding; a trained model's margins are what users' images meet."""

import tempfile

import numpy as np

from keras_vit.benchmark.inference import agreement, keras_forward, near_ties


def run_case(case, against, repeats, log):
    """One row per Keras mode of `case["compilers"]`: the bf16 copy's top-1 agreement with the
    float32 model on the held-out digits, its largest logit error, the share of images whose
    float32 top-2 gap is under twice that error, and both models' top-1 accuracy. `case`:
    `epochs` (None: the default's), `seed`, `compilers` (default: XLA)."""
    import keras

    from keras_vit.saving import inference_copy, load_model
    from keras_vit.training import TrainConfig, export_samples, fit

    with tempfile.TemporaryDirectory() as run_dir:
        config = TrainConfig(dataset="digits", run_dir=run_dir, epochs=case.get("epochs"), seed=case.get("seed", 0))
        fit(config, verbose=0)
        model = load_model(run_dir)  # its best.keras, as `keras-vit evaluate` loads it
        samples = export_samples(model, run_dir)
    images, labels = samples["eval_images"].astype("float32"), samples["eval_labels"]
    copy = inference_copy(model, dtype="mixed_bfloat16")
    rows = []
    for compiler in case.get("compilers", ("xla",)):
        on_device = keras.ops.convert_to_tensor(images[:1])
        reference = keras_forward(model, compiler, on_device)[1](images, 64)
        logits = keras_forward(copy, compiler, on_device)[1](images, 64)
        error = float(np.max(np.abs(logits - reference)))
        row = dict(
            case=case["name"],
            implementation="keras_vit",
            mode="mixed_bfloat16",
            compiler=compiler,
            agreement_with_float32=agreement(logits, reference),
            agreement_images=len(images),
            max_logit_error=error,
            near_ties=float(np.mean(near_ties(reference, error))),
            top1_float32=float(np.mean(np.argmax(reference, -1) == labels)),
            top1=float(np.mean(np.argmax(logits, -1) == labels)),
        )
        log(row)
        rows.append(row)
    return rows
