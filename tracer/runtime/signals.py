"""Signals as a readable fd, so the live loop's one select() waits for everything."""

from __future__ import annotations

import os
import signal


class Signals:
    """SIGINT, SIGTERM and SIGUSR1 queued in `pending` and woken through the fd `r`; restore() puts back the old."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.pending: list[int] = []
        self._old_fd = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._on_signal) for s in self.HANDLED}

    def _on_signal(self, signum, frame) -> None:
        self.pending.append(signum)

    def take(self) -> list[int]:
        try:
            while os.read(self.r, 512):
                pass
        except BlockingIOError:
            pass
        out, self.pending = self.pending, []
        return out

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._old_fd)
        if self.r >= 0:
            os.close(self.r)
            os.close(self.w)
            self.r = self.w = -1
