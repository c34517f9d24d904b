"""tracer.osutil.open_output and replace_as_user without sudo: never through a link, never a non-file.

(Under sudo, as the invoking user: tests/privileged/test_outputs.py.)
"""

from __future__ import annotations

import os

import pytest

from tracer import osutil
from tracer.errors import UserError


@pytest.fixture(autouse=True)
def no_sudo(monkeypatch):
    for k in ("SUDO_UID", "SUDO_GID"):
        monkeypatch.delenv(k, raising=False)


def test_append_creates_then_appends(tmp_path):
    p = tmp_path / "a.jsonl"
    with osutil.open_output(str(p)) as f:
        assert f.tell() == 0
        f.write("one\n")
    with osutil.open_output(str(p)) as f:
        assert f.tell() == 4        # --csv writes its header only at 0
        f.write("two\n")
    assert p.read_text() == "one\ntwo\n"


def test_write_truncates_and_binary(tmp_path):
    p = tmp_path / "x.png"
    p.write_bytes(b"old contents, longer")
    with osutil.open_output(str(p), "wb") as f:
        f.write(b"new")
    assert p.read_bytes() == b"new"
    with pytest.raises(UserError, match="File exists"):
        osutil.open_output(str(p), "x")


@pytest.mark.parametrize("mode", ["a", "w", "wb", "x"])
def test_symlink_refused_and_target_untouched(tmp_path, mode):
    target = tmp_path / "target"
    target.write_text("keep\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    why = "File exists" if mode == "x" else "it is a symbolic link"     # O_EXCL: a link is there
    with pytest.raises(UserError, match=rf"^cannot write .*link: {why}"):
        osutil.open_output(str(link), mode)
    assert target.read_text() == "keep\n"


@pytest.mark.parametrize("mode", ["a", "w"])
def test_hard_link_refused_before_truncating(tmp_path, mode):
    target = tmp_path / "target"
    target.write_text("keep\n")
    os.link(target, tmp_path / "second")
    with pytest.raises(UserError, match="2 hard links"):
        osutil.open_output(str(tmp_path / "second"), mode)
    assert target.read_text() == "keep\n"


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="cannot write"):      # no reader: refused at once, no hang
        osutil.open_output(str(fifo))
    with pytest.raises(UserError, match="not a regular file"):
        osutil.open_output("/dev/null")


def test_replace_refuses_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep\n")
    (tmp_path / "r.json").symlink_to(target)
    with osutil.open_output(str(tmp_path / "tmp"), "x") as f:
        f.write("new\n")
    with pytest.raises(UserError, match="symbolic link"):
        osutil.check_output(str(tmp_path / "r.json"))
    with pytest.raises(UserError, match="symbolic link"):
        osutil.replace_as_user(str(tmp_path / "tmp"), str(tmp_path / "r.json"))
    assert target.read_text() == "keep\n"
    osutil.replace_as_user(str(tmp_path / "tmp"), str(tmp_path / "fresh.json"))
    assert (tmp_path / "fresh.json").read_text() == "new\n"


def test_bench_result_write_refuses_a_symlink(tmp_path):
    from tracer.model import benchresult as br

    target = tmp_path / "target"
    target.write_text("keep\n")
    (tmp_path / "r.json").symlink_to(target)
    with pytest.raises(UserError, match="symbolic link"):
        br.write(str(tmp_path / "r.json"), br.BenchResult("s", "1", [], {}, 1))
    assert target.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "target"]
