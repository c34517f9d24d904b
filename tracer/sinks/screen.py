"""top's screen: each interval drawn with curses; q quits, s changes the sort (keys come through the live loop)."""

from __future__ import annotations

from tracer.views.top import SORTS, screen_lines


def add_arguments(p, mode: str) -> None:
    if mode == "top":
        p.add_argument("--sort", choices=SORTS, default="p99", help="order of the rows (default p99; s changes it)")


class ScreenSink:
    """Draws every window on the curses screen `scr`; `lines` is the last screen's text, which goes into
    `keep` too when the run ends at its deadline (top N COUNT leaves it printed, as biotop does)."""

    def __init__(self, scr, sort: str, interval: float, where: str, keep: list[str] | None = None):
        import curses

        self.keep = keep
        self.scr = scr
        self.sort = sort
        self.interval = interval
        self.where = where
        self.dump = None
        self.lines: list[str] = []
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        scr.nodelay(True)
        self.draw()

    def draw(self) -> None:
        import curses

        self.lines = screen_lines(self.dump, self.sort, self.interval, self.where, self.scr.getmaxyx()[0])
        height, width = self.scr.getmaxyx()
        self.scr.erase()
        for y, text in enumerate(self.lines[:height]):
            attr = curses.A_REVERSE if y == 3 else (curses.A_BOLD if y == 0 else curses.A_NORMAL)
            try:
                self.scr.addnstr(y, 0, text, max(width - 1, 0), attr)
            except curses.error:
                pass        # the last cell of a tiny screen: nothing to do about it
        self.scr.refresh()

    def on_key(self) -> bool:
        """Keys waiting on the terminal: True when one of them quits."""
        redraw = False
        while (key := self.scr.getch()) != -1:
            if key in (ord("q"), ord("Q")):
                return True
            if key in (ord("s"), ord("S")):
                self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
            redraw = True       # a resize, or a new sort
        if redraw:
            self.draw()
        return False

    def inputs(self) -> dict:
        """The terminal's keys, for the live loop to watch."""
        import sys

        return {sys.stdin.fileno(): self.on_key}

    def on_end(self, reason: str) -> None:
        if reason == "deadline" and self.keep is not None:
            self.keep[:] = self.lines

    def on_dump(self, window) -> None:
        self.dump = window
        self.draw()

    def close(self, status: int) -> int:
        return status


def from_args(ns, ctx) -> ScreenSink | None:
    """In top only, inside curses.wrapper: ctx.extra holds the screen, the interval, what is traced, and the
    list the last screen is kept in."""
    if ctx.mode != "top":
        return None
    e = ctx.extra
    return ScreenSink(e["scr"], ns.sort, e["interval"], e["where"], e.get("keep"))
