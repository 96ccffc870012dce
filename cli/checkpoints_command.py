"""`keras-vit checkpoints`: the names `--weights` takes, with what is published of each."""

from keras_vit_cli.names import names


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "checkpoints",
        help="list the checkpoint names --weights takes: family, resolution, data, ImageNet top-1, licence, size",
        description="List the published checkpoints `--weights` (and `keras_vit.ViT.from_preset(weights=...)`, "
        "`convert`) take by name: the official ViT and AugReg releases (downloaded once into "
        "$KERAS_HOME/keras_vit) and the family presets' Hugging Face Hub repositories (hf://ORG/NAME, through the "
        "Hugging Face cache), with each one's family, resolution, pre-training data, published ImageNet-1k top-1 "
        "and its source, licence, parameters and whether it is already cached here. A cell is '—' where the fact "
        "is not known for certain (or, for the top-1, where the checkpoint has no ImageNet-1k head). Any other "
        "hf://ORG/NAME of a timm, Transformers or keras-hub ViT is taken too.",
    )
    parser.add_argument("--family", choices=names.CHECKPOINT_FAMILIES, help="only this family")
    parser.add_argument("--search", metavar="TEXT", help="only names, presets or data containing TEXT (any case)")
    parser.set_defaults(run=run)


def run(args):
    from keras_vit.checkpoints import catalog
    from keras_vit_cli import CommandError

    rows = [
        entry
        for entry in catalog.entries()
        if (args.family is None or entry.family == args.family)
        and (
            args.search is None
            or any(args.search.lower() in text.lower() for text in (entry.name, entry.preset, entry.data))
        )
    ]
    if not rows:
        raise CommandError(f"no checkpoint matches{_filters(args)}; `keras-vit checkpoints` lists them all.")
    header = ("name", "family", "res", "pre-training data", "ImageNet top-1 % (source)", "licence", "params", "cached")
    cells = [catalog.describe(entry) + ("yes" if entry.cached else "no",) for entry in rows]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    for row in [header, *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    sources = sorted({entry.source for entry in rows if entry.source})
    if sources:
        print()
    for key in sources:
        print(f"{key}: {catalog.SOURCES[key]}")


def _filters(args):
    given = [f"--family {args.family}" if args.family else "", f"--search {args.search!r}" if args.search else ""]
    return " " + " ".join(g for g in given if g) if any(given) else ""
