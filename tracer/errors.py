"""Errors meant for the user: one line saying what is wrong and how to fix it."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the CLI prints it as one line and exits non-zero."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
