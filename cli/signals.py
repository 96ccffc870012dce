"""How a command stopped by a signal reports it: the line on stderr and the exit status; and
SIGTERM stopping a command as Ctrl-C does."""

import contextlib
import signal
import threading


class Terminated(KeyboardInterrupt):
    """The KeyboardInterrupt `sigterm_as_interrupt` raises; `signum` names the signal."""

    def __init__(self, signum=signal.SIGTERM):
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Runs the block with SIGTERM (`kill`, `docker stop`) raising `Terminated` as Ctrl-C raises
    KeyboardInterrupt, so that `finally` blocks run (staged files removed) before the command
    stops; Python's default for SIGTERM ends the process at once. Changes nothing outside the main
    thread or where someone else's SIGTERM handler is installed; the handler before is restored."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if not in_main_thread or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted(stop):
    """How a KeyboardInterrupt stopped the command: Ctrl-C, or the signal it names (`signum`)."""
    signum = getattr(stop, "signum", signal.SIGINT)
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


def exit_status(stop):
    """128 + the signal's number, as a shell reports a command a signal stopped."""
    return 128 + getattr(stop, "signum", signal.SIGINT)
