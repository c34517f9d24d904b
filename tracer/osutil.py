"""Who the user behind sudo is, and files written on their behalf.

Base layer: no iotrace imports but errors.  The control socket, -o/--csv
files and bench results are owned by the invoking user, not root.
"""

from __future__ import annotations

import os
import pwd
from typing import TextIO

from tracer.errors import UserError


def invoking_user() -> pwd.struct_passwd | None:
    """The user behind sudo, when we are root because of sudo."""
    uid = os.environ.get("SUDO_UID")
    if os.geteuid() != 0 or not uid:
        return None
    try:
        return pwd.getpwuid(int(uid))
    except (KeyError, ValueError):
        return None


def give_to_user(path: str) -> None:
    """chown `path` to the user behind sudo, if any (best effort)."""
    user = invoking_user()
    if user:
        try:
            os.chown(path, user.pw_uid, user.pw_gid)
        except OSError:
            pass


def open_output(path: str) -> TextIO:
    """`path` opened for appending (-o, --csv), owned by the user behind sudo; UserError if it cannot be."""
    try:
        f = open(path, "a")  # noqa: SIM115 - lives as long as the trace
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    give_to_user(path)
    return f


def quiet_close(f) -> None:
    """Close a file whose writes failed (a full disk): its buffer is dropped, the descriptor closed, nothing raised."""
    try:
        f.close()       # flushes first: that fails again, but the descriptor is closed all the same
    except OSError:
        pass
