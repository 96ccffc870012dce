"""Where a command's output goes: its result on stdout, progress (Keras's bars and epoch lines,
which Keras writes to stdout) on stderr, so `keras-vit evaluate RUN | jq` reads the result alone."""

import contextlib
import sys


@contextlib.contextmanager
def progress_on_stderr():
    """Inside: what is written to stdout goes to stderr (a live bar there when stderr is a terminal)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield
