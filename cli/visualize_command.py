"""`keras-vit visualize`: heat maps of what a ViT looks at, on your images."""

import importlib.util
from pathlib import Path

import numpy as np

from keras_vit_cli import images as image_io
from keras_vit_cli.names import names

METHODS = names.ATTENTION_METHODS + names.SALIENCY_METHODS


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "visualize",
        help="attention rollout, class-token attention or tf-keras-vis saliency on images",
        description="Draw where a ViT looks. rollout: attention rollout (Abnar & Zuidema; the paper's "
        "Figure 6); attention: the class token's raw attention per layer and head (one figure per image); "
        "saliency, smoothgrad, gradcam++, scorecam: tf-keras-vis methods (on Keras's TensorFlow backend, "
        "whatever KERAS_BACKEND says), the CAM "
        "methods on the `patch_grid` layer. Each image is shown beside its overlay.",
    )
    parser.add_argument("model", help=".keras file, run directory (best.keras) or checkpoint")
    parser.add_argument("images", nargs="+", help="image files (any format Pillow reads) or http(s) URLs")
    parser.add_argument("--method", choices=METHODS, default="rollout", help="what to draw (default: rollout)")
    parser.add_argument("--class-index", type=int, help="class to explain (saliency methods; default: predicted)")
    parser.add_argument(
        "--out",
        required=True,
        help="output figure: .png (also without a suffix), .svg, .pdf, .jpg or another format matplotlib writes",
    )
    parser.set_defaults(run=run, keras_backend=_backend)


def _backend(args):
    """tf-keras-vis's methods run on TensorFlow only: they take its Keras backend where it is
    installed, whatever KERAS_BACKEND says (the attention methods run on any backend)."""
    if args.method not in names.SALIENCY_METHODS:
        return None
    if importlib.util.find_spec("tensorflow") is None:
        raise ModuleNotFoundError("tf-keras-vis runs on TensorFlow", name="tensorflow")
    return "tensorflow"


def run(args):
    from keras_vit import inspect, plot
    from keras_vit.saving import index_names, label_names, load_model

    if args.class_index is not None and args.method in names.ATTENTION_METHODS:
        raise ValueError(f"--class-index applies to the saliency methods; {args.method} shows the attention itself.")
    plot.figure_path(args.out)  # bad input fails before the model loads
    image_io.image_files(args.images, folders=False)
    model = load_model(args.model)
    pixels = np.stack(
        [image_io.load_image(path, model.image_transform, channels=model.config.channels)[0] for path in args.images]
    )
    image_names = [Path(p).name for p in args.images]
    if args.method == "attention":
        maps = inspect.class_token_attention(model, pixels)
        outs = [_numbered(args.out, i, len(pixels)) for i in range(len(pixels))]
        for i, out in enumerate(outs):
            plot.class_token_attention(maps, out, i, image_names[i], model.config.classifier != "token")
    else:
        if args.method == "rollout":
            maps, title = inspect.rollout_maps(model, pixels), "attention rollout"
        else:
            from keras_vit.saliency import saliency_maps

            maps, title = saliency_maps(model, pixels, args.method, args.class_index), args.method
        labels = image_names
        if model.config.num_classes:
            classes = label_names(args.model, model)
            named = classes != index_names(model.config.num_classes)
            predicted = np.argmax(model.predict(pixels, verbose=0), axis=-1)
            labels = map_labels(image_names, predicted, classes if named else None, args.class_index)
        outs = [plot.heatmap_overlays(pixels, maps, args.out, title, labels)]
    for out in outs:
        print(f"wrote {out}")


def map_labels(image_names, predicted, class_names=None, class_index=None):
    """Each heat map's title: the image and the class the map explains, the predicted one or
    `class_index` (then the prediction beside it); `class_names` (None: indices only)."""

    def described(c):
        return f"class {c}" + (f": {class_names[c]}" if class_names else "")

    if class_index is None:
        return [f"{n} ({described(c)})" for n, c in zip(image_names, predicted)]
    return [f"{n} ({described(class_index)}; predicted {described(c)})" for n, c in zip(image_names, predicted)]


def _numbered(path, index, count):
    path = Path(path)
    return path if count == 1 else path.with_name(f"{path.stem}_{index}{path.suffix or '.png'}")
