"""`keras-vit convert`: any supported checkpoint -> a .keras model file."""

from pathlib import Path

from keras_vit_cli.options import add_model_options, model_overrides


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "convert",
        help="convert an official .npz, timm, Hugging Face or keras-hub checkpoint to a .keras model",
        description="Read a checkpoint (official/big_vision .npz, timm .safetensors/.pth/.bin, a Hugging Face "
        "model folder, a keras-hub ViT preset folder, .keras file or kaggle:// handle, a known name from "
        "`keras_vit.list_checkpoints()`, or a keras_vit .keras model or run directory to adapt) and save it as a "
        ".keras model. "
        "Without --preset the architecture is read off the checkpoint; with it, the preset (and "
        "--image-size/--num-classes) decides and the checkpoint is adapted: position embeddings "
        "resampled, a fresh zero head when the class count differs.",
    )
    parser.add_argument(
        "source",
        help="checkpoint file, Hugging Face folder, keras-hub preset folder, known checkpoint name, .keras model "
        "or run directory",
    )
    parser.add_argument("output", help="the .keras file to write")
    parser.add_argument("--preset", help="build this preset instead of reading the architecture off the file")
    add_model_options(parser)
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
    overrides = model_overrides(args)
    if args.preset:
        model = keras_vit.ViT.from_preset(args.preset, weights=args.source, **overrides)
    else:
        model = keras_vit.ViT.from_checkpoint(args.source, **overrides)
    output.parent.mkdir(parents=True, exist_ok=True)
    keras_vit.saving.save_model(model, output)
    c = model.config
    print(
        f"wrote {output}: {keras_vit.count_params(model):,} parameters, {c.num_layers} layers, width "
        f"{c.hidden_size}, {c.num_heads} heads, {c.image_size[0]}x{c.image_size[1]} input, {c.num_classes} classes"
        + (" with names" if model.class_names else "")
    )
