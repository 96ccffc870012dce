"""Where a command's output goes: its result on stdout, progress (Keras's bars and epoch lines,
which Keras writes to stdout) on stderr, so `keras-vit evaluate RUN | jq` reads the result alone."""

import contextlib
import logging
import os
import sys
from pathlib import Path

from keras_vit_cli.names import names


@contextlib.contextmanager
def progress_on_stderr():
    """Inside: what is written to stdout goes to stderr (a live bar there when stderr is a
    terminal), from Python and from native code alike (Gloo's connection lines in a JAX
    multi-process job are written to the process's standard output by C++)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptors 1 and 2 to redirect (an embedding host): Python's stdout only
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def note_unfinished_run(command, source):
    """A note on stderr when `source`, the model a command reads, is a run directory whose
    training has not finished (no evaluation written yet, or a resume state left): stopped, or
    still training."""
    if not source or not Path(source).is_dir():
        return
    run = Path(source)
    model = next((name for name in names.RUN_CHECKPOINTS if (run / name).is_file()), None)
    if model and (run / names.RUN_CONFIG).is_file() and not names.run_finished(run):
        print(
            f"keras-vit {command}: note: the run in {source} has not finished (stopped, or still training); "
            f"its {model} may not be its final model",
            file=sys.stderr,
        )


class StderrHandler(logging.Handler):
    def emit(self, record):
        print(self.format(record), file=sys.stderr)  # today's stderr, also when it was swapped


def show_log(level=logging.WARNING):
    """keras_vit's log records at `level` and above on stderr, each its message alone (they begin
    "keras_vit: "). In a process where nothing has set up logging (a shell's, not a test's), they
    stay off the root logger, where TensorFlow's absl adds a handler that would print them again
    as "WARNING:keras_vit:keras_vit: ..."."""
    logger = logging.getLogger("keras_vit")
    if not any(isinstance(handler, StderrHandler) for handler in logger.handlers):
        if not logging.root.handlers:
            logger.propagate = False
        logger.addHandler(StderrHandler())
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)


def one_line(path):
    """`path` as text that prints on one line: characters that are not printable (a newline or
    other control character in a file name, the bytes of a name that is not UTF-8, which Python
    holds as lone surrogates) are written as Python escapes, `\\n`, `\\udcff`."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(path))
