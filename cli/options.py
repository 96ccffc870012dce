"""Options shared by the commands that build a model."""


def add_model_options(parser):
    parser.add_argument("--image-size", type=int, nargs="+", metavar="PIXELS", help="H [W] of the model's input")
    parser.add_argument("--num-classes", type=int, help="classes of the head (0: no head)")
    parser.add_argument(
        "--num-heads", type=int, help="attention heads (for a timm file of a width no paper variant has)"
    )


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
    return overrides


def check_image_size(pixels):
    """Raises ValueError unless `--image-size`'s values (an int or a list) are positive."""
    values = pixels if isinstance(pixels, (list, tuple)) else [pixels]
    if min(values) < 1:
        raise ValueError(f"--image-size must be positive; got {' '.join(map(str, values))}.")
