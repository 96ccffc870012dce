"""`keras-vit convert`: any supported checkpoint -> a .keras model file."""

import json
import zipfile
from pathlib import Path

from keras_vit_cli.names import names
from keras_vit_cli.options import add_model_options, model_overrides


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "convert",
        help="convert an official .npz, timm, Hugging Face or keras-hub checkpoint to a .keras model",
        description="Read a checkpoint (official/big_vision .npz, timm .safetensors/.pth/.bin, a Hugging Face "
        "model folder, a keras-hub ViT preset folder, .keras file or kaggle:// handle, a Hugging Face Hub "
        "repository hf://ORG/NAME[@REVISION] (timm, Transformers or keras-hub; the local cache first), a known name "
        "(`keras-vit checkpoints`), or a keras_vit .keras model or run directory to adapt) and save it as a "
        ".keras model with the input normalisation, size, crop and interpolation the checkpoint ships with. "
        "Without --preset the architecture is read off the checkpoint; with it, the preset (and "
        "--image-size/--num-classes) decides and the checkpoint is adapted: position embeddings "
        "resampled, a fresh zero head when the class count differs.",
    )
    parser.add_argument(
        "source",
        help="checkpoint file, Hugging Face folder, keras-hub preset folder, hf://ORG/NAME[@REVISION], known "
        "checkpoint name, .keras model or run directory",
    )
    parser.add_argument("output", help="the .keras file to write")
    parser.add_argument("--preset", help="build this preset instead of reading the architecture off the file")
    add_model_options(parser)
    parser.add_argument(
        "--dtype",
        choices=names.PRECISIONS,
        help="dtype policy of the written model (default: a keras_vit .keras model's or run's own, e.g. the "
        "mixed_bfloat16 of a run trained so; float32 for other checkpoints)",
    )
    parser.add_argument(
        "--labels",
        help="file of class names, one per line in logit order: the written model's class names (replacing the "
        "checkpoint's, if it has any; its head is kept as it is)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    parser.set_defaults(run=run)


def run(args):
    import keras_vit
    from keras_vit_cli import CommandError

    output = Path(args.output)
    if output.suffix != ".keras":
        raise CommandError(f"the output must be a .keras file; got {args.output}.")
    if output.is_dir():
        raise CommandError(f"{output} is a folder; the output is a .keras file.")
    if output.exists() and not args.overwrite:
        raise CommandError(f"{output} exists; pass --overwrite to replace it.")
    blocking = next((parent for parent in output.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise CommandError(f"cannot write {output}: {blocking} is a file, not a folder.")
    labels = keras_vit.saving.read_labels_file(args.labels) if args.labels else None
    overrides = model_overrides(args)
    # A keras_vit model keeps how it computes (a run trained in mixed_bfloat16 stays so) unless --dtype says.
    dtype = args.dtype or source_policy(args.source)
    if args.preset:
        model = keras_vit.ViT.from_preset(args.preset, weights=args.source, dtype=dtype, **overrides)
    else:
        model = keras_vit.ViT.from_checkpoint(args.source, dtype=dtype, **overrides)
    if labels is not None:
        if len(labels) != model.config.num_classes:
            raise CommandError(
                f"{args.labels} names {len(labels)} classes; the model has {model.config.num_classes} "
                "(--num-classes sets the count, with a new head)."
            )
        model.class_names = labels
    output.parent.mkdir(parents=True, exist_ok=True)
    keras_vit.saving.save_model(model, output)
    c, policy = model.config, model.dtype_policy.name
    print(
        f"wrote {output}: {keras_vit.count_params(model):,} parameters, {c.num_layers} layers, width "
        f"{c.hidden_size}, {c.num_heads} heads, {c.image_size[0]}x{c.image_size[1]} input ({_transform(c)}), "
        f"{c.num_classes} classes"
        + (" with names" if model.class_names else "")
        + f", dtype policy {policy}"
        + (" (the source's; --dtype float32 for float32)" if policy != "float32" and not args.dtype else "")
    )


def _transform(config):
    """The input transform of a model's `config` in words: normalisation, crop, interpolation."""
    from keras_vit.config import normalization_name

    name = normalization_name(config.input_mean, config.input_std)
    values = f"mean {','.join(f'{v:g}' for v in config.input_mean)} std {','.join(f'{v:g}' for v in config.input_std)}"
    normalized = (name or values) if config.normalize_inputs else "no normalisation"
    return f"{normalized}, crop {config.crop_fraction:g}, {config.interpolation}"


def source_policy(source):
    """The dtype policy name a keras_vit `.keras` model (or a run directory's best.keras, else
    last.keras) computes in, read off its config; None for other checkpoints or when unreadable."""
    path = Path(source)
    if path.is_dir():
        path = next((path / name for name in names.RUN_CHECKPOINTS if (path / name).is_file()), path)
    if path.suffix != ".keras" or not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    if not isinstance(config, dict) or config.get("class_name") != "ViT":  # a keras-hub or other Keras model
        return None
    dtype = (config.get("config") or {}).get("dtype")
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    return name if name in names.PRECISIONS else None
