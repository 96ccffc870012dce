"""Options shared by the commands that build a model."""


def add_model_options(parser):
    parser.add_argument("--image-size", type=int, nargs="+", metavar="PIXELS", help="H [W] of the model's input")
    parser.add_argument("--num-classes", type=int, help="classes of the head (0: no head)")


def model_overrides(args):
    """ViTConfig overrides from `--image-size` and `--num-classes`."""
    overrides = {}
    if args.image_size:
        if len(args.image_size) > 2:
            raise ValueError("--image-size takes one or two values (height [width]).")
        overrides["image_size"] = tuple(args.image_size) * (3 - len(args.image_size))
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    return overrides
