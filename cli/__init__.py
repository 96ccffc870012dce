"""The `keras-vit` command: one entry point, one module per subcommand.

The top floor: it imports keras_vit and its applications only when a command runs, so
`keras-vit --help` and argument errors answer without loading Keras or TensorFlow.
"""

import argparse
import contextlib
import difflib
import importlib
import importlib.metadata
import logging
import os
import re
import select
import sys
import threading

from keras_vit_cli import (
    benchmark_command,
    checkpoints_command,
    convert_command,
    doctor_command,
    export_command,
    inspect_command,
    presets_command,
    summary_command,
    train_command,
    visualize_command,
)
from keras_vit_cli.output import note_unfinished_run, show_log
from keras_vit_cli.signals import exit_status, interrupted

COMMANDS = (
    presets_command,
    summary_command,
    checkpoints_command,
    convert_command,
    train_command,
    export_command,
    visualize_command,
    inspect_command,
    benchmark_command,
    doctor_command,
)


class CommandError(Exception):
    """Bad input found by a command: printed as one line, exit status 2."""


# What TensorFlow's and LiteRT's native code prints to the process's stderr whatever the Python
# log level says: absl INFO lines and the notice before them, the converter's quantisation
# settings, LiteRT's XNNPACK notice, the JPEG decoder's line per broken file while an image
# folder is checked (the check counts them in one warning), and oneDNN's notice, logged as an
# error, that a float16 model (bfloat16 on a CPU without AVX-512) falls back to Eigen's kernels.
# Nothing in them is for the user to act on.
_NATIVE_NOISE = re.compile(
    rb"(I\d{4} \d|WARNING: All log messages before absl::InitializeLog"
    rb"|INFO: Created TensorFlow Lite XNNPACK delegate|fully_quantize: \d"
    rb"|E\d{4} [\d:. ]+\d+ jpeg_mem\.cc:\d+\] |Improper call to JPEG library in state \d+"
    rb"|E\d{4} [\d:. ]+\d+ util\.cc:\d+\] oneDNN supports DT_(HALF|BFLOAT16) only on platforms with AVX-512)"
)


def installed_version():
    """The installed distribution's version, read without importing keras_vit (and Keras)."""
    try:
        return importlib.metadata.version(doctor_command.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (`keras-vit train: error: ...`) pointing at
    `--help`, not argparse's usage block (dozens of lines for `train`) before the line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def build_parser():
    # No abbreviated options: `--model` must not silently mean `--model-parallel`.
    parser = _Parser(
        prog="keras-vit",
        allow_abbrev=False,
        description="Vision Transformer (ViT) toolkit for Keras 3. "
        "Run `keras-vit COMMAND --help` for the options of a command.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's start-up and INFO log lines (hidden unless TF_CPP_MIN_LOG_LEVEL is set)",
    )
    parser.add_argument("--version", action="version", version=f"keras-vit {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    for subparser in subparsers.choices.values():  # also after the command: `keras-vit train --verbose`
        subparser.allow_abbrev = False
        subparser.add_argument(
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show TensorFlow's start-up and INFO log lines",
        )
    parser.commands = subparsers.choices  # command name -> its parser
    return parser


@contextlib.contextmanager
def _native_noise_filtered():
    """Runs the block with file descriptor 2 read line by line through a pipe, passing on at once
    every line but `_NATIVE_NOISE`."""
    sys.stderr.flush()
    saved = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def pump():
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:
                if not _NATIVE_NOISE.match(line):
                    os.write(saved, line)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the pump drains it and stops
        thread.join(timeout=5)
        os.close(saved)


def _unrecognized(parser, command, unknown):
    """Exits (status 2) naming the command's unknown arguments and, for a misspelt or shortened
    option, the command's closest one."""
    subparser = parser.commands[command]
    options = [o for action in subparser._actions for o in action.option_strings if o.startswith("--")]
    hints = []
    for argument in (a.split("=")[0] for a in unknown if a.startswith("--")):
        close = [o for o in options if o.startswith(argument)] or difflib.get_close_matches(
            argument, options, n=1, cutoff=0.75
        )
        hints += [f"{argument}: did you mean {' or '.join(close[:3])}?"] if close else []
    subparser.error(f"unrecognized arguments: {' '.join(unknown)}" + "".join(f"; {h}" for h in hints))


def _run(args):
    """Imports keras_vit (and with it Keras and its backend), then runs the command. Native
    INFO lines stay out of normal output unless asked for (`--verbose`) or the user set
    TF_CPP_MIN_LOG_LEVEL. A command that works on one Keras backend only (`keras_backend`, or
    a function of the arguments giving it or None) gets it, with a note when the user's
    KERAS_BACKEND named another."""
    if getattr(args, "standalone", False):  # reads package metadata only: no Keras, no TensorFlow
        return args.run(args)
    if getattr(args, "check", None):  # bad input that needs no Keras, refused before it loads
        args.check(args)
    backend = getattr(args, "keras_backend", None)
    if callable(backend):
        backend = backend(args)
    if backend and "keras" not in sys.modules and os.environ.get("KERAS_BACKEND", backend) != backend:
        print(
            f"keras-vit {args.command}: runs on Keras's {backend} backend here, not KERAS_BACKEND="
            f"{os.environ['KERAS_BACKEND']}",
            file=sys.stderr,
        )
        os.environ["KERAS_BACKEND"] = backend
    if not logging.root.handlers:  # a shell's process: keras_vit's warnings as plain lines
        show_log()
    if args.command != "train":  # train notes the run of its --weights or its --config's weights
        note_unfinished_run(args.command, getattr(args, "model", None) or getattr(args, "source", None))
    if args.verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        importlib.import_module("keras_vit")
        return args.run(args)
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    with _native_noise_filtered():
        importlib.import_module("keras_vit")
        return args.run(args)


def main(argv=None):
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unrecognized(parser, args.command, unknown)
    try:
        return _run(args) or 0
    except BrokenPipeError as error:
        if not _stdout_closed():
            print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
            return 2
        # The reader left (`keras-vit predict ... | head`): stop quietly, as shell tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except ModuleNotFoundError as error:
        print(f"keras-vit {args.command}: error: {_not_installed(error)}", file=sys.stderr)
        return 2
    # CheckpointError is a ValueError; keras_vit.training.TrainingError a RuntimeError.
    except (CommandError, ValueError, OSError, RuntimeError) as error:
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print(f"keras-vit {args.command}: {interrupted(stop)}", file=sys.stderr)
        return exit_status(stop)


# The extra of setup.cfg that installs an optional package a command imports.
_EXTRAS = {
    "tensorflow": "tensorflow",
    "jax": "jax",
    "tensorflow_datasets": "training",
    "yaml": "training",
    "sklearn": "training",
    "ai_edge_litert": "export",
    "matplotlib": "inspect",
    "tf_keras_vis": "inspect",
}


def _not_installed(error):
    """One line for a missing optional package, naming the install that brings it."""
    package = (error.name or "").split(".")[0]
    extra = _EXTRAS.get(package)
    hint = f"pip install '{doctor_command.DISTRIBUTION}[{extra}]'" if extra else "install it"
    what = "TensorFlow" if package == "tensorflow" else f"the Python package {package}"
    return f"this command needs {what}, which is not installed: {hint}."


def _stdout_closed():
    """Whether standard output is a pipe whose reader has gone (poll reports an error on it)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows) or no file descriptor
        return False
