"""The words of the tables: plain ones by default, the block layer's for --hist.

This module owns how a table names what kernel people have short names for:
a write-back row (charged to the process that dirtied the pages), the two
parts of a request's latency (queue and device), and coverage (requests
recorded against the disk's own count in /proc/diskstats).  The people who
train models read the default tables and the verdict, so those say
"write-back", "queue", "device" and "N of M requests on loop6 were this
job's"; `--hist` (latency bars: the view for people who read blktrace) keeps
"(wb)", Q:/D: and the coverage ratio.  Every table takes its words from
here: PLAIN or JARGON, picked by words_for(hist).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracer.text import safe

WRITE_BACK = "write-back"     # the OP cell of a write-back row, in plain words
WB_MARK = " (wb)"             # the COMM cell's mark of a write-back row, in the block layer's


@dataclass(frozen=True)
class Words:
    jargon: bool
    split_heads: tuple[str, str, str, str]      # queue p50, queue p99, device p50, device p99
    latency: str                                # what the latency columns are, in the table's title line

    def comm_op(self, comm: str, op: str, wb: bool, width: int | None = 15) -> tuple[str, str]:
        """A row's COMM cell (`width` wide at most; None: whole) and OP cell, made safe; a write-back row (Series.wb)
        says so in its OP cell ("write-back"), or with --hist in its COMM cell ("name (wb)")."""
        comm, op = safe(comm), safe(op)
        if not wb:
            return comm[:width], op
        if self.jargon:
            return f"{comm[:None if width is None else width - len(WB_MARK)]}{WB_MARK}", op
        # a write-back row is a write: its op is never another one (tracer.sources' write-back rows)
        return comm[:width], WRITE_BACK if op == "write" else f"{op} {WRITE_BACK}"

    def coverage(self, devices: list[tuple[str, int, int]], filtered: bool) -> str | None:
        """The coverage line of (disk, requests recorded, requests it completed per /proc/diskstats), or None
        when no disk completed a request (nothing to say)."""
        shown = [(safe(n), rec, ker) for n, rec, ker in devices if rec or ker]
        if not shown:
            return None
        if self.jargon:
            parts = [f"{n} {rec}/{ker}" + (f" ({100 * rec / ker:.1f}%)" if ker else "") for n, rec, ker in shown]
            why = "; a pid or cgroup filter leaves the rest out" if filtered else ""
            return f"coverage: requests recorded / completed per /proc/diskstats: {', '.join(parts)}{why}"
        parts = ", ".join(f"{rec} of {ker} requests on {n}" for n, rec, ker in shown)
        return f"{parts} were this job's" if filtered else f"{parts} were recorded"


PLAIN = Words(False, ("QUEUE p50", "QUEUE p99", "DEVICE p50", "DEVICE p99"),
              "latency per request p50..max, then its two parts: time in the queue and in the device")
JARGON = Words(True, ("Q:p50", "Q:p99", "D:p50", "D:p99"),
               "total latency (p50..max), Q = queue (~Q2D), D = device (D2C)")


# --bio's rows (Dump.submitted): a bio's latency, then its two parts: until the request that took it started
# (a tag, a plug, the queue's entry) and from there to the bio's completion
SUBMITTED_HEADS = {False: ("WAIT p50", "WAIT p99", "IN-RQ p50", "IN-RQ p99"),
                   True: ("W:p50", "W:p99", "R:p50", "R:p99")}
SUBMITTED_TITLE = {False: ("as submitted (--bio): each I/O from its submission to its completion, a split one "
                           "whole, then its wait for a request and the time from that request's start"),
                   True: ("as submitted (--bio): bio latency, block_bio_queue to block_bio_complete; W = until its "
                          "request's start, R = from there")}


def submitted_words(words: Words) -> Words:
    """The words of the as-submitted rows' table, beside `words`' for the requests'."""
    return Words(words.jargon, SUBMITTED_HEADS[words.jargon], SUBMITTED_TITLE[words.jargon])


def words_for(hist: bool) -> Words:
    """The --hist view speaks the block layer's words; every other, plain ones."""
    return JARGON if hist else PLAIN
