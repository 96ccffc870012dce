"""`keras-vit inspect`: all of the paper's inspection figures of one model."""

import sys
from pathlib import Path

import numpy as np

from keras_vit_cli import images as image_io


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "inspect",
        help="write the paper's inspection figures of a model to a folder",
        description="Write the figures of the paper's section 4.5 for one model: patch-embedding filter "
        "principal components, position-embedding similarity, mean attention distance per head and layer, "
        "attention rollout and class-token attention (on --images, by default scikit-learn's bundled photos).",
    )
    parser.add_argument("model", help=".keras file, run directory (best.keras) or checkpoint")
    parser.add_argument("--out", required=True, help="folder for the figures")
    parser.add_argument(
        "--images", nargs="+", help="image files or http(s) URLs for the attention figures (default: bundled photos)"
    )
    parser.add_argument("--format", default="png", choices=("png", "svg", "pdf"), help="figure format (default: png)")
    parser.set_defaults(run=run)


def run(args):
    from keras_vit import inspect, plot
    from keras_vit.saving import load_model

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; inspect writes its figures into a folder.")
    image_io.image_files(args.images or [], folders=False)
    model = load_model(args.model)
    transform, channels = model.image_transform, model.config.channels  # as the model is evaluated
    if args.images:
        pixels = np.stack([image_io.load_image(p, transform, channels=channels)[0] for p in args.images])
        image_names = [Path(p).name for p in args.images]
    else:
        image_names = ["china.jpg", "flower.jpg"]
        pixels = np.stack([image_io.load_image(None, transform, sample=n, channels=channels)[0] for n in image_names])
    ext = args.format
    written = []
    if model.config.resnet_layers is None:
        components = inspect.patch_embedding_components(model)
        written.append(plot.patch_components(*components, out / f"patch_embedding_components.{ext}"))
    else:
        note = "a hybrid embeds ResNet features, not pixels: no patch_embedding_components"
        print(f"keras-vit inspect: note: {note}", file=sys.stderr)
    if model.config.position_embedding:
        written.append(
            plot.position_similarity(inspect.position_embedding_similarity(model), out / f"position_similarity.{ext}")
        )
    else:
        note = "the model's positions are rotary embeddings alone: no position_similarity"
        print(f"keras-vit inspect: note: {note}", file=sys.stderr)
    written += [
        plot.attention_distance(inspect.model_attention_distance(model, pixels), out / f"attention_distance.{ext}"),
        plot.heatmap_overlays(
            pixels, inspect.rollout_maps(model, pixels), out / f"rollout.{ext}", "attention rollout", image_names
        ),
        plot.class_token_attention(
            inspect.class_token_attention(model, pixels),
            out / f"class_token_attention.{ext}",
            image_name=image_names[0],
            mean_pooled=model.config.classifier != "token",
        ),
    ]
    for path in written:
        print(f"wrote {path}")
