"""Options shared by the commands that build a model."""


def add_model_options(parser):
    parser.add_argument("--image-size", type=int, nargs="+", metavar="PIXELS", help="H [W] of the model's input")
    parser.add_argument("--num-classes", type=int, help="classes of the head (0: no head)")
    parser.add_argument(
        "--num-heads", type=int, help="attention heads (for a timm file of a width no paper variant has)"
    )


def model_overrides(args):
    """ViTConfig overrides from `--image-size`, `--num-classes` and `--num-heads`."""
    overrides = {}
    if args.image_size:
        if len(args.image_size) > 2:
            raise ValueError("--image-size takes one or two values (height [width]).")
        overrides["image_size"] = tuple(args.image_size) * (3 - len(args.image_size))
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.num_heads is not None:
        overrides["num_heads"] = args.num_heads
    return overrides
