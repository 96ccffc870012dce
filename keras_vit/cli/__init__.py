"""The `keras-vit` command: one entry point, one module per subcommand."""

import argparse
import sys

from keras_vit.cli import (
    benchmark_command,
    convert_command,
    export_command,
    inspect_command,
    presets_command,
    summary_command,
    train_command,
    visualize_command,
)

COMMANDS = (presets_command, summary_command, convert_command, train_command, export_command, visualize_command,
            inspect_command, benchmark_command)  # fmt: skip


class CommandError(Exception):
    """Bad input found by a command: printed as one line, exit status 2."""


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="Vision Transformer (ViT) toolkit for Keras 3. "
        "Run `keras-vit COMMAND --help` for the options of a command.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    # CheckpointError is a ValueError; keras_vit.training.TrainingError a RuntimeError.
    except (CommandError, ValueError, OSError, RuntimeError) as error:
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keras-vit {args.command}: interrupted", file=sys.stderr)
        return 130
