"""--dev resolved once: tracer.sources.devices.device_filter over a fake sysfs, and the one option every live
mode declares (tracer.cli.common.add_device_option)."""

from __future__ import annotations

import dataclasses

import pytest

from tracer.errors import UserError
from tracer.sources import devices
from tracer.sources.devices import DeviceFilter, device_filter, kdev

LOOP0, LOOP3, NVME = kdev(7, 0), kdev(7, 3), kdev(259, 0)


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    """/sys/block and /sys/dev/block with loop0, loop3 and nvme0n1 (and nvme0n1's partition nvme0n1p1)."""
    block, dev_block = tmp_path / "block", tmp_path / "dev_block"
    for name, (major, minor) in {"loop0": (7, 0), "loop3": (7, 3), "nvme0n1": (259, 0)}.items():
        (block / name).mkdir(parents=True)
        (block / name / "dev").write_text(f"{major}:{minor}\n")
        (dev_block / f"{major}:{minor}").mkdir(parents=True)
        (dev_block / f"{major}:{minor}" / "uevent").write_text(f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\n")
    (block / "nvme0n1" / "nvme0n1p1").mkdir()
    (block / "nvme0n1" / "nvme0n1p1" / "dev").write_text("259:1\n")
    monkeypatch.setattr(devices, "SYS_BLOCK", block)
    monkeypatch.setattr(devices, "SYS_DEV_BLOCK", dev_block)


@pytest.mark.parametrize("specs, names, devs", [
    ([], (), ()),
    (["loop0"], ("loop0",), (LOOP0,)),
    (["/dev/loop3"], ("loop3",), (LOOP3,)),
    (["7:3"], ("loop3",), (LOOP3,)),
    (["259:0", "loop0"], ("nvme0n1", "loop0"), (NVME, LOOP0)),
])
def test_device_filter_keeps_the_names_as_given_and_resolves_each_once(sysfs, specs, names, devs):
    f = device_filter(specs)
    assert (f.given, f.names, f.devs) == (tuple(specs), names, devs)
    assert bool(f) is bool(specs)
    assert f.name_list == (list(names) or None)


@pytest.mark.parametrize("spec, says", [
    ("sdz", "--dev sdz: no such block device; known devices: loop0, loop3, nvme0n1"),
    ("7:9", "--dev 7:9: no such block device"),
    ("7:x", "--dev 7:x: no such block device"),
    ("/dev/null", "--dev /dev/null: a partition or not a whole disk"),
])
def test_a_bad_device_is_one_line_exit_2(sysfs, spec, says):
    with pytest.raises(UserError) as exc:
        device_filter(["loop0", spec])
    assert str(exc.value).startswith(says) and "\n" not in str(exc.value)
    assert exc.value.exit_code == 2


def test_a_device_filter_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DeviceFilter().devs = (LOOP0,)      # type: ignore[misc]


@pytest.mark.parametrize("module", ["tracer.cli.trace", "tracer.cli.serve", "tracer.cli.top"])
def test_every_live_mode_declares_the_same_dev_option(module):
    import importlib

    from tracer.cli.common import DEV_HELP

    mod = importlib.import_module(module)
    p = mod.trace_parser() if module == "tracer.cli.trace" else mod.parser()
    (action,) = [a for a in p._actions if "--dev" in a.option_strings]
    assert (action.dest, action.help, action.metavar, action.default) == ("devs", DEV_HELP, "DEV", [])
    assert p.parse_args(["--dev", "loop0", "--dev", "7:3"]).devs == ["loop0", "7:3"]


def test_the_alerts_and_the_live_run_take_the_filters_names(sysfs):
    import argparse

    from tracer.runtime.session import LiveRun, alert_check

    f = device_filter(["7:3"])
    ns = argparse.Namespace(alerts=["loop0:p99>1ms"])
    with pytest.raises(UserError, match=r"loop0 is not traced \(--dev loop3\)"):
        alert_check(ns, devices=f)
    assert alert_check(argparse.Namespace(alerts=["loop3:p99>1ms"]), devices=f) is not None
    assert alert_check(ns, devices=DeviceFilter()) is not None      # every disk traced: loop0 too
    assert LiveRun("trace", argparse.Namespace(), devices=f).devices == ["loop3"]
    assert LiveRun("trace", argparse.Namespace(), devices=DeviceFilter()).devices is None
