"""Exact statistics of the matched requests, and iotrace's dumps checked against them."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from tracer import contract
from tracer.sources.devices import devno, name_of

from .events import DISTURBED_NS, MEAN_JITTER_NS, SAMPLE_JITTER_NS, TruthError
from .matcher import Request

PHASES = tuple(contract.load().phases)          # queue, device, total: iotrace's phases
PCTS = (50.0, 90.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p99", "p99.9")
REL_TOL = 0.02                         # percentiles: within 2% of the exact value, or the same bucket


# ---------------------------------------------------------------------------- statistics

def nearest_rank(sorted_vals: np.ndarray, q: float) -> int:
    """The nearest-rank percentile q (in percent) of sorted values: rank max(1, ceil(q/100 * n))."""
    n = len(sorted_vals)
    rank = max(1, math.ceil(Fraction(str(q)) * n / 100))
    return int(sorted_vals[rank - 1])


@dataclass
class TruthSeries:
    tgid: int
    dev: int
    op: str
    comm: str
    count: int = 0
    bytes: int = 0
    samples: dict[str, np.ndarray] = field(default_factory=dict)   # phase -> sorted ns
    # phase -> sorted lower / upper bounds of the samples (equal to them but where a stamp was disturbed)
    low: dict[str, np.ndarray] = field(default_factory=dict)
    high: dict[str, np.ndarray] = field(default_factory=dict)
    disturbed: dict[str, int] = field(default_factory=dict)    # phase -> samples known only within bounds
    wb: bool = False     # write-back charged to its dirtier (Series.wb)

    @property
    def key(self) -> tuple[int, str, str, bool]:
        return (self.tgid, devno(self.dev), self.op, self.wb)


def aggregate(requests: Iterable[Request]) -> dict[tuple[int, str, str], TruthSeries]:
    """Series (tgid, devno, op) of exact samples."""
    groups: dict[tuple[int, int, str, bool], list[Request]] = defaultdict(list)
    for r in requests:
        groups[(r.tgid, r.dev, r.op, r.wb)].append(r)
    out = {}
    for (tgid, dev, op, wb), reqs in groups.items():
        reqs.sort(key=lambda r: r.complete_ns)
        s = TruthSeries(tgid, dev, op, reqs[-1].comm, len(reqs), sum(r.bytes for r in reqs), wb=wb)
        for ph in PHASES:
            b = np.asarray([v for r in reqs if (v := r.phase_bounds(ph)) is not None], dtype=np.int64)
            if len(b):
                s.samples[ph], s.low[ph], s.high[ph] = (np.sort(b[:, i]) for i in range(3))
                s.disturbed[ph] = int(np.count_nonzero((b[:, 1] != b[:, 0]) | (b[:, 2] != b[:, 0])))
        out[s.key] = s
    return out


# ---------------------------------------------------------------------------- comparison

@dataclass
class Scope:
    """Which requests iotrace was in a position to see.

    A request counts if it started at or after `surely_from` and completed
    at or before `surely_until` (ns, CLOCK_MONOTONIC), on one of `devs` (all
    if empty) and, if `tgids` is given, by one of those processes.  Requests
    started before `maybe_from` or completed after `maybe_until` are left
    out as explained (iotrace was not attached); ones in between are
    ambiguous and reported.
    """

    surely_from: int
    surely_until: int
    maybe_from: int | None = None
    maybe_until: int | None = None
    tgids: set[int] | None = None
    devs: list[int] = field(default_factory=list)
    label: str = ""


@dataclass
class Check:
    name: str            # "count", "bytes", "total.p50", "device.max", ...
    exact: float | None
    reported: float | None
    ok: bool
    how: str = ""        # "equal", "2%", "bucket", or why it failed


@dataclass
class SeriesResult:
    key: tuple[int, str, str, bool]     # (tgid, devno, op, wb)
    comm: str
    device: str
    status: str                   # "compared", "only-truth", "only-iotrace"
    checks: list[Check] = field(default_factory=list)
    truth: TruthSeries | None = None
    iotrace: object | None = None  # tracer.model.dump.Series

    @property
    def ok(self) -> bool:
        return self.status == "compared" and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass
class Comparison:
    series: list[SeriesResult]
    excluded: Counter             # reason -> requests left out of scope, explained
    ambiguous: list[Request]      # requests at the edge of iotrace's window
    iotrace_dropped: dict[str, int]
    iotrace_events: dict[str, int]
    truth_notes: Counter
    scope: Scope

    @property
    def twins(self) -> int:
        """Times two requests at one (dev, sector) were in flight together and the reference paired their
        events only by order (no request address in its stamps): their latencies may be swapped, here and in
        a tracer that also knows requests by (dev, sector), so no comparison of such a run is exact."""
        return self.truth_notes.get("same_sector_overlap", 0)

    @property
    def ok(self) -> bool:
        return (all(s.ok for s in self.series) and not any(self.iotrace_dropped.values())
                and not self.ambiguous and not self.twins)

    def problems(self) -> list[str]:
        out = []
        for s in self.series:
            if s.status != "compared":
                out.append(f"{_fmt_key(s)}: {s.status}")
            for c in s.failures:
                out.append(f"{_fmt_key(s)}: {c.name} exact={_fmt_val(c)[0]} iotrace={_fmt_val(c)[1]} ({c.how})")
        for k, v in self.iotrace_dropped.items():
            if v:
                out.append(f"iotrace dropped {v} event(s): {k}")
        if self.ambiguous:
            out.append(f"{len(self.ambiguous)} request(s) at the edge of iotrace's window (device not quiet)")
        if self.twins:
            out.append(f"{self.twins} time(s) two requests at one sector were in flight together, paired by order "
                       f"only: the workload's jobs need ranges of their own")
        return out

    def accounting_problems(self) -> list[str]:
        """The problems that are not about latency values: missing series, counts, bytes, phases, drops."""
        timing = re.compile(r": (queue|device|total)\.(p50|p90|p99|p99\.9|max|mean) ")
        return [p for p in self.problems() if not timing.search(p)]

    def find(self, comm: str | None = None, device: str | None = None, op: str | None = None,
             tgid: int | None = None) -> list[SeriesResult]:
        return [s for s in self.series if (comm is None or s.comm == comm) and
                (device is None or s.device == device or s.key[1] == device) and
                (op is None or s.key[2] == op) and (tgid is None or s.key[0] == tgid)]


def within(exact: float, low: float, high: float, reported: float, rel: float = REL_TOL,
            noise: float = 0) -> tuple[bool, str]:
    """Whether a reported value matches the exact one: within `rel` or in its bucket.

    Where disturbed stamps leave the exact value known only within [low,
    high], anything within `rel` of that range or in a bucket it touches
    passes too; so does anything within `noise` ns of it.
    """
    from tracer.model.histogram import bucket_index

    def bucket(v: float) -> int:
        return bucket_index(max(0, int(round(v))))

    if abs(reported - exact) <= rel * exact:
        return True, f"{rel:.0%}" if rel else "equal"
    if bucket(exact) == bucket(reported):
        return True, "bucket"
    if abs(reported - exact) <= noise:
        return True, f"within {noise:.0f} ns, the stamps' jitter"
    if (low, high) != (exact, exact):
        if (low * (1 - rel) - noise <= reported <= high * (1 + rel) + noise
                or bucket(low) <= bucket(reported) <= bucket(high)):
            return True, "within the disturbed stamps' bounds"
        return False, (f"off by {reported - exact:+.0f} ns ({(reported - exact) / max(exact, 1):+.1%}), "
                       f"outside [{low:.0f}, {high:.0f}] ns")
    return False, f"off by {reported - exact:+.0f} ns ({(reported - exact) / max(exact, 1):+.1%}), other bucket"


def load_iotrace(dumps) -> tuple[dict, dict[str, int], dict[str, int]]:
    """iotrace's series by (tgid, devno, op), merged over dumps (tracer.model.dump.Dump or JSON dicts)."""
    from tracer.codec import jsonl
    from tracer.model import dump as dumpmod

    ds = [d if isinstance(d, dumpmod.Dump) else jsonl.from_json(d) for d in dumps]
    if not ds:
        raise TruthError("iotrace wrote no dumps")
    merged = dumpmod.merge_dumps(ds)
    return {s.key: s for s in merged.series}, merged.dropped, merged.events


def _counted(name: str, exact: int, reported: int, short: int = 0) -> Check:
    """An exact count, or one iotrace may fall short of by `short` (requests the reference could not place)."""
    if reported == exact:
        return Check(name, exact, reported, True, "equal")
    if exact - short <= reported < exact:
        return Check(name, exact, reported, True, f"within {short} the reference's stamps missed")
    return Check(name, exact, reported, False, "differs")


def compare_series(t: TruthSeries, s, short: tuple[int, int] | None = None) -> list[Check]:
    """Checks of one iotrace series (tracer.model.dump.Series) against the exact one.

    `short`: (requests, bytes) the series may lack (_resolve_unseen).
    """
    n_short, b_short = short or (0, 0)
    checks = [_counted("count", t.count, s.count, n_short), _counted("bytes", t.bytes, s.bytes, b_short)]
    for ph in PHASES:
        exact = t.samples.get(ph)
        st = s.phases.get(ph)
        n_exact = 0 if exact is None else len(exact)
        n_rep = 0 if st is None else st.count
        checks.append(_counted(f"{ph}.count", n_exact, n_rep, n_short))
        if not n_exact or not n_rep:
            continue
        low, high = t.low[ph], t.high[ph]
        summary = st.summary_us()
        # iotrace keeps the exact sum: its mean may differ only by the stamps' own jitter
        mean = st.sum_ns / n_rep
        ok, how = within(float(np.mean(exact)), float(np.mean(low)), float(np.mean(high)), mean,
                          noise=MEAN_JITTER_NS)
        checks.append(Check(f"{ph}.mean", float(np.mean(exact)), mean, ok, how))
        for q, k in zip(PCTS, PCT_KEYS, strict=True):
            ok, how = within(nearest_rank(exact, q), nearest_rank(low, q), nearest_rank(high, q),
                              summary[k] * 1e3, noise=SAMPLE_JITTER_NS)
            checks.append(Check(f"{ph}.{k}", nearest_rank(exact, q), summary[k] * 1e3, ok, how))
        # a single sample: the stamps' own jitter is not averaged out
        ok, how = within(exact[-1], low[-1], high[-1], st.max_ns, rel=0, noise=DISTURBED_NS)
        checks.append(Check(f"{ph}.max", exact[-1], st.max_ns, ok, how))
    return checks


UNSEEN = "the kernel ran no BPF program for its start or completion"
UNSEEN_MISSED = "the kernel skipped the reference's program for its start or completion, and iotrace's"


def _resolve_unseen(kept: list[Request], iot: dict, excluded: Counter) -> tuple[list[Request], dict]:
    """Split the requests the reference's before-copy missed (bpf_maybe) by whether iotrace has them.

    On raw tracepoints the kernel guards each program alone: a run of the
    stamper skipped while another was preempted on the CPU need not skip
    iotrace's.  Only the count tells: a series whose iotrace count is its
    seen requests' has none of them (each left out, explained); one that
    has them all is compared with them (each within its stamps' window).
    Where it has some, all are compared and the series' counts may fall
    short by the rest: (series key) -> (requests, bytes) iotrace may lack.
    """
    seen: Counter = Counter()
    maybe: dict[tuple, list[Request]] = defaultdict(list)
    for r in kept:
        key = (r.tgid, devno(r.dev), r.op, r.wb)
        if r.bpf_seen:
            seen[key] += 1
        else:
            maybe[key].append(r)
    out = [r for r in kept if r.bpf_seen]
    short: dict[tuple, tuple[int, int]] = {}
    for key, rs in maybe.items():
        got = iot[key].count if key in iot else 0
        if got <= seen[key]:
            excluded[UNSEEN_MISSED] += len(rs)
            continue
        out += rs
        if got < seen[key] + len(rs):
            excluded[UNSEEN_MISSED] += seen[key] + len(rs) - got
            short[key] = (seen[key] + len(rs) - got, sum(r.bytes for r in rs))
    return out, short


def _unexplained_drops(dropped: dict[str, int], unseen: int) -> dict[str, int]:
    """iotrace's drops less those the reference saw happen: events the kernel ran no BPF program for.

    A request whose start no program saw costs iotrace a "skipped_start"
    (when the kernel counted the skip) and its completion a "no_start"; one
    whose completion no program saw is a "skipped_complete" (raw
    tracepoints) or a "lost_completion" (perf-event tracepoints).
    """
    out = dict(dropped)
    for reason in ("skipped_start", "skipped_complete", "no_start", "lost_completion"):
        if reason in out:
            out[reason] = max(0, out[reason] - unseen)
    return out


def compare(requests: Iterable[Request], dumps, scope: Scope, notes: Counter | None = None) -> Comparison:
    """iotrace's dumps against the exact requests in `scope`; `notes` are the truth's, for the report."""
    iot, dropped, events = load_iotrace(dumps)
    maybe_from = scope.surely_from if scope.maybe_from is None else scope.maybe_from
    maybe_until = scope.surely_until if scope.maybe_until is None else scope.maybe_until
    excluded: Counter = Counter()
    ambiguous = []
    kept = []
    comms = {r.tid: r.comm for r in requests if r.comm}
    for r in requests:
        if scope.devs and r.dev not in scope.devs:
            continue
        if r.dirtier is not None and (scope.tgids is None or r.dirtier[0] in scope.tgids):
            # a flusher's request for a traced dirtier's inode: the dirtier's write-back
            tgid, tid, comm = r.dirtier
            r = replace(r, tgid=tgid, tid=tid, comm=comm if comm and comm != "<...>" else comms.get(tid, ""), wb=True)
        if scope.tgids is not None and r.tgid not in scope.tgids:
            excluded[f"{r.comm or r.tgid} (tgid {r.tgid}) is not traced"] += 1
        elif not r.bpf_seen and not r.bpf_maybe:
            # no BPF program ran for its start or completion: iotrace cannot have it
            excluded[UNSEEN] += 1
        elif r.start_ns < maybe_from:
            excluded["started before iotrace attached"] += 1
        elif r.complete_ns > maybe_until:
            excluded["completed after iotrace stopped"] += 1
        elif r.start_ns < scope.surely_from or r.complete_ns > scope.surely_until:
            ambiguous.append(r)
        else:
            kept.append(r)
    kept, unseen = _resolve_unseen(kept, iot, excluded)
    truth = aggregate(kept)
    dropped = _unexplained_drops(dropped, excluded[UNSEEN] + excluded[UNSEEN_MISSED])
    results = []
    for key in sorted(set(truth) | set(iot), key=lambda k: (k[0], k[1], k[2])):
        t, s = truth.get(key), iot.get(key)
        name = name_of(t.dev) if t else s.device
        if t and s:
            results.append(SeriesResult(key, t.comm, name, "compared", compare_series(t, s, unseen.get(key)), t, s))
        elif t:
            results.append(SeriesResult(key, t.comm, name, "only-truth", [], t, None))
        else:
            results.append(SeriesResult(key, s.comm, name, "only-iotrace", [], None, s))
    _explain_skips_outside_scope(results, dropped, excluded)
    return Comparison(results, excluded, ambiguous, dict(dropped), dict(events), Counter(notes or {}), scope)


OUTSIDE = "a program run the kernel skipped, counted by iotrace, for a request outside the traced scope"


def _explain_skips_outside_scope(results: list, dropped: dict[str, int], excluded: Counter) -> None:
    """Move counted skips that cost no traced request from iotrace's drops into `excluded`.

    The kernel counts a skipped program run (a recursion miss) before the
    program could know whose request it was: iotrace reports it, for the
    whole machine.  A skip of a traced request leaves that request out of
    its series (a start's as "no_start", a completion's unrecorded), so its
    count differs; when every series the truth has is there with its exact
    count and bytes and none is iotrace's alone, each skip was someone
    else's (under TCG a guest's other processes and interrupts hit these).
    """
    skips = {r: dropped.get(r, 0) for r in ("skipped_start", "skipped_complete")}
    if not any(skips.values()):
        return
    for s in results:
        if s.status != "compared" or not all(c.ok for c in s.checks if c.name in ("count", "bytes")):
            return
    # a skipped completion leaves its slot: the request's next issue counts it a lost completion
    skips["lost_completion"] = min(dropped.get("lost_completion", 0), skips["skipped_complete"])
    for reason, n in skips.items():
        if n:
            excluded[f"{OUTSIDE} ({reason})"] += n
            dropped[reason] -= n


# ---------------------------------------------------------------------------- rendering

def _shown_comm(s: SeriesResult) -> str:
    return f"{s.comm[:10]} (wb)" if s.key[3] else s.comm[:15]


def _fmt_ns(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v < 1e3:
        return f"{v:.0f}ns"
    if v < 1e6:
        return f"{v / 1e3:.2f}us" if v < 1e4 else f"{v / 1e3:.1f}us"
    if v < 1e9:
        return f"{v / 1e6:.3f}ms"
    return f"{v / 1e9:.3f}s"


def _fmt_val(c: Check) -> tuple[str, str]:
    if c.name in ("count", "bytes") or c.name.endswith(".count"):
        return (str(c.exact), str(c.reported))
    return (_fmt_ns(c.exact), _fmt_ns(c.reported))


def _fmt_key(s: SeriesResult) -> str:
    return f"{s.key[0]} {s.comm}{' (wb)' if s.key[3] else ''} {s.device} {s.key[2]}"


def render(cmp: Comparison, all_checks: bool = False) -> str:
    """A text table, iotrace (iot) against the exact values (ex), one line per series and phase."""
    cols = ("PID", "COMM", "DEV", "OP", "PHASE", "COUNT ex/iot", "BYTES ex/iot",
            "p50 ex/iot", "p99 ex/iot", "p99.9 ex/iot", "max ex/iot", "VERDICT")
    rows = []
    for s in cmp.series:
        t, i = s.truth, s.iotrace
        if s.status != "compared":
            rows.append((str(s.key[0]), _shown_comm(s), s.device, s.key[2], "-",
                         f"{t.count if t else '-'}/{i.count if i else '-'}",
                         f"{t.bytes if t else '-'}/{i.bytes if i else '-'}", "", "", "", "",
                         "FAIL " + s.status))
            continue
        first = True
        for ph in PHASES:
            if ph not in t.samples and ph not in i.phases:
                continue
            cells = []
            for k in ("p50", "p99", "p99.9", "max"):
                try:
                    c = s.check(f"{ph}.{k}")
                    cells.append(f"{_fmt_ns(c.exact)}/{_fmt_ns(c.reported)}{'' if c.ok else '!'}")
                except KeyError:
                    cells.append("-")
            bad = [c for c in s.failures if c.name.startswith(ph + ".") or (first and "." not in c.name)]
            verdict = "ok" if not bad else "FAIL " + ",".join(c.name.split(".")[-1] if "." in c.name
                                                               else c.name for c in bad)
            rows.append((str(s.key[0]) if first else "", _shown_comm(s) if first else "",
                         s.device if first else "", s.key[2] if first else "", ph,
                         f"{t.count}/{i.count}" if first else "",
                         f"{t.bytes}/{i.bytes}" if first else "", *cells, verdict))
            first = False
    widths = [max(len(c), *(len(r[n]) for r in rows)) if rows else len(c) for n, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not rows:
        lines.append("(no series on either side)")
    for reason, n in sorted(cmp.excluded.items()):
        lines.append(f"explained, not compared: {n} request(s): {reason}")
    if cmp.truth_notes:
        lines.append("truth notes: " + ", ".join(f"{k}={v}" for k, v in sorted(cmp.truth_notes.items())))
    ev = {k: v for k, v in cmp.iotrace_events.items() if v}
    if ev:
        lines.append("iotrace notes: " + ", ".join(f"{k}={v}" for k, v in sorted(ev.items())))
    probs = cmp.problems()
    if all_checks:
        for s in cmp.series:
            for c in s.checks:
                ex, rep = _fmt_val(c)
                lines.append(f"  {_fmt_key(s)} {c.name}: exact {ex} iotrace {rep} -> {'ok' if c.ok else 'FAIL'} "
                             f"({c.how})")
    lines.append("RESULT: " + ("PASS" if cmp.ok else f"FAIL ({len(probs)} problem(s))"))
    lines += ["  " + p for p in probs]
    return "\n".join(lines)
