"""`keras-vit presets`: the table of model variants."""


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "presets",
        help="list the ViT presets",
        description="List every preset name with its description. Build one with "
        "`keras_vit.ViT.from_preset(NAME)` or inspect it with `keras-vit summary NAME`.",
    )
    parser.set_defaults(run=run)


def run(args):
    from keras_vit import presets

    width = max(map(len, presets.PRESETS))
    for name in presets.list_presets():
        print(f"{name:<{width}}  {presets.describe_preset(name)}")
