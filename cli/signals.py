"""How a command stopped by a signal reports it: the line on stderr and the exit status."""

import signal


def interrupted(stop):
    """How a KeyboardInterrupt stopped the command: Ctrl-C, or the signal it names (`signum`)."""
    signum = getattr(stop, "signum", signal.SIGINT)
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


def exit_status(stop):
    """128 + the signal's number, as a shell reports a command a signal stopped."""
    return 128 + getattr(stop, "signum", signal.SIGINT)
