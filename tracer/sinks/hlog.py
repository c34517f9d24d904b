"""HdrHistogram interval logs (``.hlog``) of dumps, written with ``hdrh``'s HistogramLogWriter.

One interval per dump window, series and latency phase, tagged with the series
(``pid:comm:device:op:phase``, ``:wb`` for a write-back row), timestamps in
seconds from the first dump's start, max in milliseconds: the format
HdrHistogram's own log tools (HistogramLogProcessor, hdrh's HistogramLogReader)
read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TextIO

from hdrh.log import HistogramLogWriter

from tracer.codec import hdr
from tracer.model.dump import Dump, Series

# A tag ends at the first comma and log tools split on white space: comm and device
# names come from the kernel and are untrusted, so anything else becomes "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def tag(s: Series, phase: str) -> str:
    parts = [str(s.pid), s.comm, s.device, s.op, phase] + (["wb"] if s.wb else [])
    return ":".join(_UNSAFE.sub("_", p) or "_" for p in parts)


class HlogWriter:
    """Writes each dump given to ``write`` as intervals of one log."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._log = HistogramLogWriter(out)
        self._base_ms: float | None = None

    def write(self, d: Dump) -> None:
        start_ms, end_ms = d.start.timestamp() * 1e3, d.end.timestamp() * 1e3
        if self._base_ms is None:
            self._base_ms = start_ms
            self._log.output_log_format_version()
            # hdrh's output_start_time() is broken in 0.10.8 (iso_format): the same line, written here
            self._log.output_comment(f"[StartTime: {start_ms / 1e3:.3f} (seconds since epoch), "
                                     f"{d.start.isoformat(' ')}]")
            self._log.output_base_time(start_ms)
            self._log.base_time = start_ms
            self._log.output_legend()
        for s in d.series:
            for phase, st in s.phases.items():
                if not st.count:
                    continue
                h = hdr.to_hdrh(st.hist)
                h.set_start_time_stamp(start_ms)
                h.set_end_time_stamp(max(end_ms, start_ms))
                # hdrh's writer has no tags: the Tag= prefix of the interval line, as Java writes it
                self._out.write(f"Tag={tag(s, phase)},")
                self._log.output_interval_histogram(h, max_value_unit_ratio=1e6)


def tee(dumps: Iterable[Dump], writer: HlogWriter) -> Iterator[Dump]:
    """``dumps``, each written to ``writer`` as it passes."""
    for d in dumps:
        writer.write(d)
        yield d
