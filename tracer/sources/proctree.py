"""The process tree under --pid targets, read from /proc, and the race-free hand-over to a BPF filter.

A tracer attached to a running trainer must trace the workers it forked
before the attach (DataLoader workers, a pool, fio's job), not only what it
forks from then on.  The BPF programs follow forks of traced processes
(sched_process_fork); what existed before is only in /proc.  attach_tree()
joins the two without a gap:

1. the filter is armed first: the roots are in it and fork-following is on;
2. /proc is read, and every descendant of a traced process that the filter
   does not hold yet is added;
3. 2 is repeated until a read finds nothing to add.

Why that is enough: a child forked by a process X is either forked after X
entered the filter (the kernel's fork hook adds it: sched_process_fork fires
after the child is in the pid table) or before (then it is in /proc before X
was added, so the next full read, begun after X was added, sees it).  Its own
children follow by the same argument one round later.  A process that exits
while we look is simply not found, or found and added as a dead pid (the
exit hook already ran: harmless, a pid can only be reused after a full wrap).

Raw readers take the /proc path, so tests feed them a fake tree.  This module
also owns the one parser of /proc/PID/stat (parse_stat, stat_of), which the
--diskstats sampler and the per-process tracer use too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tracer.text import safe

PROC = "/proc"
MAX_ROUNDS = 64     # reads of /proc before giving up on a tree that keeps changing faster than we read it


@dataclass(frozen=True)
class ProcStat:
    """What iotrace reads of /proc/PID/stat (proc(5): fields 2, 3, 4 and 22)."""

    comm: str
    state: str          # R, S, D, Z, X, ...
    ppid: int
    start_ticks: int    # when the process started, in clock ticks after boot: a pid and it tell processes apart


def parse_stat(text: str) -> ProcStat:
    """The fields of a /proc/PID/stat text; ValueError if it is not one.  comm (between the first "(" and the
    last ")") may hold spaces and parentheses."""
    close = text.rfind(")")
    open_ = text.find("(")
    if close < 0 or open_ < 0 or open_ > close:
        raise ValueError("no comm in stat")
    rest = text[close + 2:].split()     # rest[0] is field 3
    if len(rest) < 20:
        raise ValueError(f"stat has {len(rest) + 2} fields, not 22 or more")
    return ProcStat(text[open_ + 1:close], rest[0], int(rest[1]), int(rest[19]))


def stat_of(pid: int | str, proc: str = PROC) -> ProcStat:
    """parse_stat of a process's stat file; OSError if it cannot be read (it exited), ValueError if it is bad."""
    with open(f"{proc}/{pid}/stat") as f:
        return parse_stat(f.read())


def read_tree(proc: str = PROC) -> dict[int, tuple[int, str]]:
    """Every live process now: pid -> (ppid, comm).  Processes that exit while it reads are left out, and
    so are zombies: they do no more I/O, and the kernel's exit hook has already taken them out of the
    filter (adding them back would keep a forking parent's tree from ever settling)."""
    out = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            st = stat_of(name, proc)
        except (OSError, ValueError):
            continue
        if st.state not in ("Z", "X"):
            out[int(name)] = (st.ppid, st.comm)
    return out


def descendants(roots: Iterable[int], tree: dict[int, tuple[int, str]]) -> set[int]:
    """Every process in `tree` below any of `roots` (the roots themselves not included)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _comm) in tree.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - set(roots)


@dataclass
class Attached:
    """What attach_tree found: the roots and their descendants alive at the last read, with their names."""

    roots: dict[int, str]
    descendants: dict[int, str]
    rounds: int
    settled: bool       # a read found nothing new (False: MAX_ROUNDS reads and the tree still changed)


def snapshot(roots: list[int], follow: bool = True, proc: str = PROC,
             tree: dict[int, tuple[int, str]] | None = None) -> Attached:
    """The roots alive now and (with `follow`) their descendants, with their names: one read of /proc."""
    tree = read_tree(proc) if tree is None else tree
    below = descendants(roots, tree) if follow else set()
    return Attached(roots={p: tree[p][1] for p in roots if p in tree},
                    descendants={p: tree[p][1] for p in sorted(below)}, rounds=1, settled=True)


def attach_tree(roots: list[int], add: Callable[[int], None], traced: Callable[[], set[int]],
                proc: str = PROC, max_rounds: int = MAX_ROUNDS, follow: bool = True) -> Attached:
    """Add every existing descendant of `roots` to a filter that already holds the roots and follows forks.

    `add(pid)` puts one process in the filter; `traced()` is what the filter
    holds now (what we added and what the kernel's fork hook added).
    `follow=False` (--no-children): the roots alone, nothing added.
    """
    if not follow:
        return snapshot(roots, follow=False, proc=proc)
    tree: dict[int, tuple[int, str]] = {}
    rounds, settled = 0, False
    while rounds < max_rounds:
        rounds += 1
        tree = read_tree(proc)
        inside = traced() | set(roots)
        missing = descendants(inside, tree) - inside
        if not missing:
            settled = True
            break
        for pid in sorted(missing):
            add(pid)
    found = snapshot(roots, tree=tree)
    found.rounds, found.settled = rounds, settled
    return found


def describe(found: Attached, shown: int = 4) -> str:
    """ "pid 4121 (python) and 2 descendants: 4130 pt_data_worker, 4131 pt_data_worker", the first
    `shown` descendants named and the rest counted.  Names are made safe for a terminal."""
    roots = ", ".join(f"{p} ({safe(c)})" for p, c in found.roots.items()) or "none alive"
    text = f"pid{'s' if len(found.roots) > 1 else ''} {roots}"
    n = len(found.descendants)
    if not n:
        return text
    names = [f"{p} {safe(c)}" for p, c in list(found.descendants.items())[:shown]]
    more = f", ... ({n - shown} more)" if n > shown else ""
    return f"{text} and {n} descendant{'s' if n > 1 else ''}: {', '.join(names)}{more}"
