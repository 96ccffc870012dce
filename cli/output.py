"""Where a command's output goes: its result on stdout, progress (Keras's bars and epoch lines,
which Keras writes to stdout) on stderr, so `keras-vit evaluate RUN | jq` reads the result alone."""

import contextlib
import os
import sys


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
