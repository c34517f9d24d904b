"""What the recorder hands the matcher: ftrace's events, with the BPF stamps that time them.

A stamp is taken by stamps.bpf.c (recorder.Stamper) at the instant iotrace
takes its own; the constants below say how far that instant can be trusted,
and the comparison's tolerances are made of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracer.sources import kernel


class TruthError(RuntimeError):
    """The reference could not be recorded exactly (lost events, bad decode, no tracefs)."""


@dataclass(frozen=True)
class Event:
    ts: int              # ns, CLOCK_MONOTONIC
    cpu: int
    seq: int             # position in its CPU's buffer
    name: str
    pid: int             # thread that was current
    tgid: int | None     # its process (from record-tgid), None if unknown
    f: dict              # the tracepoint's fields
    stamp: Stamp | None = None   # when BPF programs saw it (see recorder.Stamper); None: not stamped


@dataclass(frozen=True)
class Stamp:
    """An event's time at iotrace's instant: BPF stamps taken just before and just after iotrace's.

    `ts` is the return stamp of the copy attached before iotrace, None if no
    BPF program ran for the event (the kernel skipped it).  `slack` is how
    much later iotrace's own stamp may be: 0 normally (the programs run back
    to back), the whole bracket (the after-copy's entry stamp - ts) when it
    was unusually wide because something ran in between (an interrupt, the
    hypervisor).  `rq` is the struct request's address where the stamper ran
    on raw tracepoints (0 otherwise): it tells apart requests in flight at
    the same sector, which ftrace's fields cannot.  A block_getrq start
    (before Linux 6.5) names the bio instead: its `rq` is 0 and `bio` the
    bio's address, and the raw issue then gives, besides the request, its
    first bio and the one after it (`bio`, `bio_next`: a front merge puts
    another bio first), by which the matcher finds that request's start.

    Raw tracepoints guard each program on its own: the kernel may skip the
    before-copy (its run on this CPU was preempted) yet run iotrace's.  Such
    an event has no `ts` but, where the after-copy ran, a `window`: iotrace's
    stamp, if it took one, lies between the ftrace event's time and the
    after-copy's entry.
    """

    ts: int | None
    slack: int = 0
    rq: int = 0
    bio: int = 0
    bio_next: int = 0
    window: tuple[int, int] | None = None

    def bounds(self) -> tuple[int, int, int] | None:
        """(value, low, high) of iotrace's stamp of the event; None where nothing bounds it."""
        if self.ts is not None:
            return self.ts, self.ts, self.ts + self.slack
        if self.window is not None:
            return self.window[0], *self.window
        return None


#: The request's start: iotrace's start events, newest first (bpf/contract.toml's events).  The
#: reference records and stamps the one iotrace uses (recorder.iotrace_start_event(), the choice
#: iotrace makes, $IOTRACE_START_EVENT included): block_io_start on Linux 6.5+, block_getrq before.
START_EVENTS = kernel.START_EVENTS
#: The start where none is named: the newest
DEFAULT_START = START_EVENTS[0]


def stamped(start_event: str = DEFAULT_START) -> tuple[str, str, str]:
    """The stamper's programs, in the order of stamps.bpf.c's enum stamp_event, for a start event."""
    if start_event not in START_EVENTS:
        raise ValueError(f"{start_event!r} is not a start event ({', '.join(START_EVENTS)})")
    return (start_event, "block_rq_issue", "block_rq_complete")


#: A bracket wider than the usual one for its event by more than this means
#: something ran in it (an interrupt, the hypervisor): iotrace's stamp is
#: then known only to lie within it.  The bracket also holds iotrace's whole
#: program, whose run time varies by a few hundred ns (cache misses), which
#: moves nothing; the gap between the first copy's return and iotrace's own
#: stamp was measured at 60-120 ns (p50), under 1.4 us (p99.9), with three
#: copies of the stamper in a row.
DISTURBED_NS = 1000
#: What one undisturbed sample may still be off by: the gap between the
#: stamper's return and iotrace's stamp varies from event to event.  Measured
#: with a third stamper copy in iotrace's place (fio 4 KiB reads on a loop
#: device): per-request phase errors of -10..+10 ns median, within +-170 ns
#: for 95% of requests, +-400 ns for 99%, +-880 ns for 99.9%.  So a
#: percentile, which sits on one sample, passes within SAMPLE_JITTER_NS of
#: the exact one: the 99.9% bound, for a run checks hundreds of percentiles
#: (at 250 ns one of a series of 3 was seen 324 ns off in CI; at 500 ns the
#: p50 of 31 buffered writes' queue times 572 ns off, 2.1%, in another); the
#: max (the most exposed sample) within DISTURBED_NS, and the mean, where the
#: errors average out, within MEAN_JITTER_NS: a stamp taken at the wrong event
#: or a phase's bound wrong moves the means by microseconds.
SAMPLE_JITTER_NS = 900
MEAN_JITTER_NS = 50
