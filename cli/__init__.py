"""The `keras-vit` command: one entry point, one module per subcommand.

The top floor: it imports keras_vit and its applications only when a command runs, so
`keras-vit --help` and argument errors answer without loading Keras or TensorFlow.
"""

import argparse
import contextlib
import importlib
import os
import re
import sys
import tempfile

from keras_vit_cli import (
    benchmark_command,
    convert_command,
    export_command,
    inspect_command,
    presets_command,
    summary_command,
    train_command,
    visualize_command,
)

COMMANDS = (
    presets_command,
    summary_command,
    convert_command,
    train_command,
    export_command,
    visualize_command,
    inspect_command,
    benchmark_command,
)


class CommandError(Exception):
    """Bad input found by a command: printed as one line, exit status 2."""


# TensorFlow's start-up INFO lines (absl format, printed before logging is set up, whatever
# TF_CPP_MIN_LOG_LEVEL says) and the notice that precedes them.
_STARTUP_NOISE = re.compile(r"(I\d{4} \d|WARNING: All log messages before absl::InitializeLog)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="Vision Transformer (ViT) toolkit for Keras 3. "
        "Run `keras-vit COMMAND --help` for the options of a command.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's start-up and INFO log lines (hidden unless TF_CPP_MIN_LOG_LEVEL is set)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    for subparser in subparsers.choices.values():  # also after the command: `keras-vit train --verbose`
        subparser.add_argument(
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show TensorFlow's start-up and INFO log lines",
        )
    return parser


@contextlib.contextmanager
def _startup_lines_hidden():
    """Runs the block with file descriptor 2 captured, then writes back what it printed except
    TensorFlow's start-up INFO lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines(keepends=True):
                if not _STARTUP_NOISE.match(line):
                    sys.stderr.write(line)


def _load_keras(verbose):
    """Imports keras_vit (and with it Keras and its backend). TensorFlow's INFO lines stay out of
    normal output unless asked for (`--verbose`) or the user set TF_CPP_MIN_LOG_LEVEL."""
    if verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        importlib.import_module("keras_vit")
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    with _startup_lines_hidden():
        importlib.import_module("keras_vit")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _load_keras(args.verbose)
        return args.run(args) or 0
    # CheckpointError is a ValueError; keras_vit.training.TrainingError a RuntimeError.
    except (CommandError, ValueError, OSError, RuntimeError) as error:
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keras-vit {args.command}: interrupted", file=sys.stderr)
        return 130
