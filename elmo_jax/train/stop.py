"""Stopping a run cleanly: SIGTERM / Ctrl-C ask the loop to checkpoint and return."""

from __future__ import annotations

import contextlib
import signal


class StopRequest:
    """SIGTERM / Ctrl-C set a flag; the loop checkpoints at the next step and returns."""

    def __init__(self):
        self.signal: str | None = None

    @contextlib.contextmanager
    def installed(self):
        previous = {}

        def handler(signum, frame):
            if self.signal is not None:  # a second signal: stop now
                signal.signal(signum, previous.get(signum, signal.SIG_DFL))
                raise KeyboardInterrupt
            self.signal = signal.Signals(signum).name

        try:
            for s in (signal.SIGTERM, signal.SIGINT):
                previous[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread: no handlers, nothing to restore
            previous = {}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
