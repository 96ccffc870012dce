"""Options shared by the commands that build a model."""

from keras_vit_cli.names import names


def add_model_options(parser):
    parser.add_argument("--image-size", type=int, nargs="+", metavar="PIXELS", help="H [W] of the model's input")
    parser.add_argument("--num-classes", type=int, help="classes of the head (0: no head)")
    parser.add_argument(
        "--num-heads", type=int, help="attention heads (for a timm file of a width no paper variant has)"
    )
    add_normalization_option(parser)


def add_normalization_option(parser):
    parser.add_argument(
        "--normalization",
        metavar="|".join(names.NORMALIZATIONS) + "|MEAN,STD",
        help="the input statistics the checkpoint's model was trained with, for a checkpoint that records none (a "
        "bare timm file; others ship theirs): imagenet (DeiT, DINOv2), inception (x / 127.5 - 1: the official ViT, "
        "AugReg, SigLIP), clip (EVA-02), or MEAN,STD in pixel units 0-255, one pair for every channel or "
        "M1,M2,M3,S1,S2,S3",
    )


def normalization_overrides(args):
    """The ViTConfig fields of `--normalization` ({} without it); a ValueError naming the flag."""
    if args.normalization is None:
        return {}
    from keras_vit.config import normalization_fields

    try:
        return normalization_fields(args.normalization)
    except ValueError as error:
        raise ValueError(f"--{error}") from None


def model_overrides(args):
    """ViTConfig overrides from `--image-size`, `--num-classes` and `--num-heads`, checked here so
    that a bad value is named by its flag (ViTConfig names its fields)."""
    overrides = {}
    if args.image_size:
        if len(args.image_size) > 2:
            raise ValueError("--image-size takes one or two values (height [width]).")
        check_image_size(args.image_size)
        overrides["image_size"] = tuple(args.image_size) * (3 - len(args.image_size))
    if args.num_classes is not None:
        if args.num_classes < 0:
            raise ValueError(f"--num-classes must be >= 0 (0: no head); got {args.num_classes}.")
        overrides["num_classes"] = args.num_classes
    if args.num_heads is not None:
        if args.num_heads < 1:
            raise ValueError(f"--num-heads must be positive; got {args.num_heads}.")
        overrides["num_heads"] = args.num_heads
    return {**overrides, **normalization_overrides(args)}


def check_image_size(pixels):
    """Raises ValueError unless `--image-size`'s values (an int or a list) are positive."""
    values = pixels if isinstance(pixels, (list, tuple)) else [pixels]
    if min(values) < 1:
        raise ValueError(f"--image-size must be positive; got {' '.join(map(str, values))}.")
