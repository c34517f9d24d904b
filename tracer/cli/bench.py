"""`sudo iotrace bench`: fio workloads repeated under iotrace (tracer.runtime.bench), summarised to a result file."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from tracer.errors import UserError
from tracer.model import benchresult as br
from tracer.options import Parser, at_least
from tracer.osutil import check_output
from tracer.runtime.bench import (
    DEFAULT_DIR,
    DEFAULT_OUTPUT,
    DEFAULT_REPEAT,
    DEFAULT_SUITE,
    SCRATCH_MB,
    SUITES,
    Device,
    Plan,
    Workload,
    device_at,
    environment,
    find_suite,
    interruptible,
    run_plan,
    scratch_loop,
)
from tracer.views.bench import render


def _suite_lines() -> str:
    return "\n".join(f"  {s.id:<12} {', '.join(w.name for w in s.workloads)}; 2 s each" for s in SUITES.values())


EPILOG = f"""\
suites (results compare only within one suite and version):
{_suite_lines()}

The workloads run on a scratch {SCRATCH_MB} MiB loop device over a file in --dir (default
{DEFAULT_DIR}); it is detached and the file removed afterwards, also on Ctrl-C and errors. Each
repetition is `iotrace -o X.jsonl --dev LOOP -- fio ...`; repetitions of different workloads
are interleaved, so drift in the machine spreads over all of them.

Your own workload, instead of a suite: a fio job file (--fio) or fio options after '--'. The
scratch device is given to fio as a global --filename (a job's own filename= wins). With
--dev, the workload runs as given and iotrace traces that existing disk.

The result (JSON) has, per workload and op, each phase's count, MB, mean and p50/p90/p99/p99.9
in every repetition, their median and [min, max] across repetitions, fio's IOPS, and the
environment: kernel, CPU, nproc, device, iotrace and fio versions, date.

examples:
  sudo iotrace bench -o new.json                  the default suite, {DEFAULT_REPEAT} repetitions
  sudo iotrace bench --fio mixed.fio -o mixed.json
  sudo iotrace bench --repeat 3 -- --rw=randread --bs=64k --size=64M
  iotrace compare base.json new.json              the regression gate (see 'iotrace compare --help')
"""


def parse_args(argv: list[str]) -> Plan:
    fio_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, fio_args = argv[:cut], argv[cut + 1:]
        if fio_args[:1] == ["fio"]:
            fio_args = fio_args[1:]     # `-- fio --rw=...` reads naturally; the bench runs fio itself
        if not fio_args:
            raise UserError("nothing after '--': give fio options, e.g. '-- --rw=randread --bs=4k --size=64M'")
    p = Parser(prog="iotrace bench", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                usage="sudo iotrace bench [--suite NAME | --fio JOBFILE | -- FIO-OPTIONS...] [--repeat N] "
                      "[-o RESULT.json]",
                description="Run a versioned suite of fio workloads (or yours) under iotrace, each several "
                            "times, and write the latency percentiles of every phase with their spread across "
                            "repetitions to a JSON result for 'iotrace compare'. Needs root.")
    p.add_argument("--suite", metavar="NAME", help=f"the suite to run (default {DEFAULT_SUITE}); a name without "
                                                   "version means its newest version")
    p.add_argument("--fio", metavar="JOBFILE", help="run this fio job file instead of a suite")
    p.add_argument("--repeat", type=at_least(1), default=DEFAULT_REPEAT, metavar="N",
                   help=f"repetitions of each workload (default {DEFAULT_REPEAT}; 'iotrace compare' needs "
                        "several to tell a change from noise)")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, metavar="RESULT.json",
                   help=f"where to write the result (default {DEFAULT_OUTPUT})")
    p.add_argument("--dir", default=DEFAULT_DIR, metavar="DIR",
                   help=f"directory for the scratch device's backing file (default {DEFAULT_DIR}, in RAM)")
    p.add_argument("--dev", metavar="DEV",
                   help="with --fio or '--': trace this existing disk instead of making a scratch device")
    ns = p.parse_args(argv)
    custom = bool(ns.fio or fio_args)
    if ns.fio and fio_args:
        raise UserError("give either --fio JOBFILE or fio options after '--', not both")
    if ns.suite and custom:
        raise UserError("give either --suite or your own workload (--fio / '--'), not both")
    if ns.dev and not custom:
        raise UserError("--dev is for your own workload (--fio or '--'); the suites write to their device, "
                        "so they run only on the scratch loop device")
    if ns.dev and ns.dir != DEFAULT_DIR:
        raise UserError("--dir is for the scratch device; with --dev there is none")
    if ns.fio:
        try:
            text = Path(ns.fio).read_bytes()
        except OSError as exc:
            raise UserError(f"--fio {ns.fio}: {exc.strerror}") from None
        # a custom suite's version is its content: results of different job files never compare
        suite, version = "custom", "sha" + hashlib.sha256(text).hexdigest()[:12]
        workloads = [Workload(Path(ns.fio).stem, (str(Path(ns.fio).resolve()),))]
    elif fio_args:
        if not any(a.startswith("--name") for a in fio_args):
            fio_args = ["--name=fio-args", *fio_args]
        suite, version = "custom", "sha" + hashlib.sha256("\0".join(fio_args).encode()).hexdigest()[:12]
        workloads = [Workload("fio-args", tuple(fio_args))]
    else:
        s = find_suite(ns.suite or DEFAULT_SUITE)
        suite, version, workloads = s.name, s.version, list(s.workloads)
    return Plan(suite, version, workloads, ns.repeat, ns.output, ns.dir, ns.dev)


def _preflight(plan: Plan) -> None:
    if os.geteuid() != 0:
        raise UserError("iotrace bench needs root (it loads BPF programs and sets up a loop device): "
                        "run 'sudo iotrace bench ...'")
    for tool in ("fio", "losetup"):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} is not installed: run 'make setup' (or apt-get install fio util-linux)")
    check_output(plan.output)     # as the sudo user: before the bench, not after it


def _announce(plan: Plan, dev: Device) -> None:
    where = f" (backing {dev.info['backing']})" if "backing" in dev.info else ""
    print(f"bench: {plan.suite}-{plan.version} on {dev.path}{where}, {plan.repeat} repetition(s)",
          file=sys.stderr, flush=True)


def run(argv: list[str], out: TextIO = sys.stdout) -> int:
    plan = parse_args(argv)
    _preflight(plan)
    with interruptible(), tempfile.TemporaryDirectory(prefix="iotrace-bench-") as tmp:
        if plan.dev:
            dev = device_at(plan.dev, kind="given")
            _announce(plan, dev)
            workloads = run_plan(plan, dev, False, Path(tmp), sys.stderr)
        else:
            with scratch_loop(plan.directory) as dev:
                _announce(plan, dev)
                workloads = run_plan(plan, dev, True, Path(tmp), sys.stderr)
    result = br.BenchResult(plan.suite, plan.version, workloads, environment(dev), plan.repeat)
    br.write(plan.output, result)
    render(result, out)
    print(f"bench: wrote {plan.output}", file=sys.stderr)
    return 0
