"""Progress output that suits where it goes: a live bar on a terminal, plain lines in a log."""

import sys

import keras


def verbosity():
    """Keras's `verbose` for progress: 1 (a live bar) on a terminal or in a notebook, 2 (one line
    per epoch or task, no control characters) when stdout is a file or a pipe. Keras's own
    `"auto"` draws the live bar, ANSI colours and all, into log files too."""
    interactive = getattr(sys.stdout, "isatty", lambda: False)() or "ipykernel" in sys.modules
    return 1 if interactive else 2


def progress_bar(total, unit_name):
    """A `keras.utils.Progbar` of `total` units (None: unknown) at `verbosity()`."""
    return keras.utils.Progbar(total, unit_name=unit_name, verbose=verbosity())
