"""`keras-vit summary`: build a preset, print its layers and size, run it on a real photo."""

import time

import numpy as np

from keras_vit_cli import images as image_io
from keras_vit_cli.options import add_model_options, model_overrides


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "summary",
        help="build a preset, print its summary and parameter count, run it on an image",
        description="Build a ViT preset (random weights), print the Keras summary and the exact "
        "parameter count, then run it on a real image (by default a photo bundled with "
        "scikit-learn) and print the output shape, timing and top-5 classes.",
    )
    parser.add_argument("preset", help="preset name, see `keras-vit presets`")
    parser.add_argument("--image", help="image file to run (JPEG/PNG/...); default: a bundled photo")
    add_model_options(parser)
    parser.add_argument("--dtype", default=None, help="dtype policy, e.g. mixed_bfloat16")
    parser.set_defaults(run=run)


def run(args):
    import keras_vit

    config = keras_vit.get_config(args.preset, **model_overrides(args))  # validates before any heavy work
    from keras_vit.transform import ImageTransform

    transform = ImageTransform.of(config)
    image, source = image_io.load_image(args.image, transform)

    model = keras_vit.ViT(config, dtype=args.dtype, name=args.preset)
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
    if not np.any(outputs):
        print("logits are all zero: the head is zero-initialised (as in the paper) until trained or loaded")
    else:
        top = np.argsort(-outputs[0])[:5]
        print("top-5 (random weights): " + ", ".join(f"class {i}: {outputs[0, i]:.4f}" for i in top))
