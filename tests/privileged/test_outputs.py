"""Files iotrace writes under sudo: opened with the invoking user's rights, never through a link.

Real runs of the CLI as root with SUDO_UID/SUDO_GID of `nobody`, as `sudo`
would start it, against a root-owned 0600 victim: the victim must come out
exactly as it went in, and iotrace must say why in one line.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import NOBODY, PYTHON, ROOT, SUDO_ENV

SECRET = b"root:secret-hash:19000:0:99999:7:::\n"


@pytest.fixture
def dirs(nobody_dir):
    """(user_dir, root_dir): a directory `nobody` owns, and a root-owned 0755 one holding a 0600 victim."""
    root = Path(tempfile.mkdtemp(prefix="iotrace-root-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        victim = root / "shadow"
        victim.write_bytes(SECRET)
        os.chmod(victim, 0o600)
        yield nobody_dir, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def sudo_run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, **SUDO_ENV}
    return subprocess.run([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def diskstats(*out: str) -> subprocess.CompletedProcess:
    return sudo_run("--diskstats", "0.2", "1", *out)


def assert_untouched(victim: Path) -> None:
    st = victim.lstat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_nlink in (1, 2)) == (0, 0, 0o600, True)
    assert victim.read_bytes() == SECRET


def assert_refused(r: subprocess.CompletedProcess, path: Path, why: str) -> None:
    assert r.returncode != 0, r.stderr
    errors = [line for line in r.stderr.splitlines() if str(path) in line]
    assert len(errors) == 1 and why in errors[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("flag", ["-o", "--csv"])
def test_symlink_to_a_root_file_is_refused(dirs, flag):
    user, root = dirs
    link = user / "out"
    link.symlink_to(root / "shadow")
    r = diskstats(flag, str(link))
    assert_refused(r, link, "symbolic link")
    assert_untouched(root / "shadow")


def test_hard_link_to_a_root_file_is_refused(dirs):
    user, root = dirs
    link = user / "out.jsonl"
    os.link(root / "shadow", link)
    r = diskstats("-o", str(link))
    assert_refused(r, link, "cannot write")
    assert_untouched(root / "shadow")


def test_hard_link_the_user_could_write_is_refused(dirs):
    # a file the user may write through its other name: still not written through a second link
    user, root = dirs
    shared = root / "shared"
    shared.write_bytes(b"x\n")
    os.chown(shared, NOBODY, NOBODY)
    link = user / "out.jsonl"
    os.link(shared, link)
    r = diskstats("-o", str(link))
    assert_refused(r, link, "hard links")
    assert shared.read_bytes() == b"x\n"


def test_a_new_file_is_created_by_the_user(dirs):
    user, _ = dirs
    out, csv = user / "new.jsonl", user / "new.csv"
    r = diskstats("-o", str(out), "--csv", str(csv))
    assert r.returncode == 0, r.stderr
    for p in (out, csv):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
        assert p.read_text().strip()


def test_appending_to_the_users_file_keeps_it(dirs):
    user, _ = dirs
    out = user / "run.jsonl"
    out.write_text('{"old": 1}\n')
    os.chown(out, NOBODY, NOBODY)
    os.chmod(out, 0o640)
    r = diskstats("-o", str(out))
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == '{"old": 1}' and len(lines) >= 2
    st = out.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o640)


def test_an_existing_file_keeps_its_owner(dirs):
    # the user may append to a world-writable root file, but it stays root's: iotrace chowns nothing
    user, _ = dirs
    out = user / "shared.jsonl"
    out.write_text("")
    os.chmod(out, 0o666)
    r = diskstats("-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_uid == 0 and out.read_text().strip()


def test_a_directory_the_user_cannot_write_is_refused(dirs):
    _, root = dirs
    for flag, name in (("-o", "made.jsonl"), ("--csv", "made.csv")):
        path = root / name
        r = diskstats(flag, str(path))
        assert_refused(r, path, "Permission denied")
        assert not path.exists()


def test_a_bpf_trace_refuses_the_symlink_too(dirs):
    user, root = dirs
    link = user / "out.jsonl"
    link.symlink_to(root / "shadow")
    r = sudo_run("-d", "1", "-o", str(link), timeout=120)
    assert_refused(r, link, "symbolic link")
    assert_untouched(root / "shadow")


@pytest.mark.parametrize("where", ["closed dir", "symlink"])
def test_bench_refuses_before_it_runs(dirs, where):
    user, root = dirs
    if where == "symlink":
        out = user / "r.json"
        out.symlink_to(root / "shadow")
    else:
        out = root / "r.json"
    r = sudo_run("bench", "--repeat", "1", "-o", str(out), "--", "--rw=randread", "--bs=4k", "--size=4m",
                 timeout=30)
    assert_refused(r, out, "symbolic link" if where == "symlink" else "Permission denied")
    assert "bench:" not in r.stderr          # refused before a scratch device was made
    assert_untouched(root / "shadow")
    assert where == "symlink" or not out.exists()


def test_a_uid_without_a_passwd_entry_is_still_the_user(dirs):
    # sudo from a uid that has no passwd entry (a container's): still its rights, not root's
    import pwd

    uid = 54321
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    user, root = dirs
    os.chown(user, uid, uid)
    env = {**os.environ, "SUDO_UID": str(uid), "SUDO_GID": str(uid)}
    out = user / "new.jsonl"
    r = subprocess.run([PYTHON, "-m", "tracer.cli", "--diskstats", "0.2", "1", "-o", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (out.stat().st_uid, out.stat().st_gid) == (uid, uid)
    r = subprocess.run([PYTHON, "-m", "tracer.cli", "--diskstats", "0.2", "1", "-o", str(root / "x.jsonl")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert_refused(r, root / "x.jsonl", "Permission denied")
