"""`keras-vit summary`: a preset or a model's layers and size, and the model run on a real photo."""

import time
from pathlib import Path

import numpy as np

from keras_vit_cli import images as image_io
from keras_vit_cli.options import add_model_options, model_overrides


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "summary",
        help="print a preset's or a model's summary and parameter count, run it on an image",
        description="Print the Keras summary and the exact parameter count of a ViT preset (built with "
        "random weights) or of a model (.keras file, run directory or checkpoint), then run it on a real "
        "image (by default a photo bundled with scikit-learn) and print the output shape, timing and "
        "top-5 classes.",
    )
    parser.add_argument(
        "model",
        metavar="preset|model",
        help="preset name (see `keras-vit presets`), or a .keras file, run directory or checkpoint",
    )
    parser.add_argument("--image", help="image file or http(s) URL to run (JPEG/PNG/...); default: a bundled photo")
    add_model_options(parser)
    parser.add_argument("--dtype", default=None, help="dtype policy, e.g. mixed_bfloat16")
    parser.set_defaults(run=run)


def run(args):
    import keras_vit
    from keras_vit.transform import ImageTransform

    trained = _is_model(args.model)
    if trained:
        from keras_vit import saving

        model = saving.load_model(args.model, **model_overrides(args))
        if args.dtype is not None:
            model = saving.in_policy(model, args.dtype)
        config, classes = model.config, saving.label_names(args.model, model) if model.config.num_classes else []
    else:
        config = keras_vit.get_config(args.model, **model_overrides(args))  # validates before any heavy work
    transform = ImageTransform.of(config)
    image, source = image_io.load_image(args.image, transform, channels=config.channels)
    if not trained:
        model = keras_vit.ViT(config, dtype=args.dtype, name=args.model)
    model.summary(line_length=96)
    print(f"parameters: {keras_vit.count_params(model):,}")
    how = "whole" if transform.crop == 1.0 else f"centre {transform.crop:g}"
    print(
        f"input: {source} resized to {config.image_size[0]}x{config.image_size[1]} ({how}, {transform.interpolation})"
    )

    batch = image[None].astype("float32")
    model.predict(batch, verbose=0)  # first call traces/compiles
    start = time.perf_counter()
    outputs = np.asarray(model.predict(batch, verbose=0))
    elapsed = time.perf_counter() - start
    print(f"output: shape {outputs.shape}, dtype {outputs.dtype}, {elapsed * 1000:.0f} ms per image")
    if trained and config.num_classes:
        import keras

        probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(outputs[0]))
        top = np.argsort(-probabilities)[:5]
        print("top-5: " + ", ".join(f"{classes[i]} {probabilities[i]:.3f}" for i in top))
    elif not config.num_classes:
        print("no head (num_classes 0): the output is the image's features")
    elif not np.any(outputs):
        print("logits are all zero: the head is zero-initialised (as in the paper) until trained or loaded")
    else:
        top = np.argsort(-outputs[0])[:5]
        print("top-5 (random weights): " + ", ".join(f"class {i}: {outputs[0, i]:.4f}" for i in top))


def _is_model(name):
    """Whether `name` names a model to load (an existing path, a known checkpoint, or what reads
    as a path: a folder or a file suffix) rather than a preset; anything else is taken as a preset
    name, whose error suggests close names."""
    from keras_vit.checkpoints.known import KNOWN_CHECKPOINTS
    from keras_vit.presets import PRESETS

    path = Path(name)
    return name not in PRESETS and (path.exists() or name in KNOWN_CHECKPOINTS or len(path.parts) > 1 or path.suffix)
