"""The iotrace command line: argv → a subcommand's module (tracer.cli.common.COMMANDS), or trace mode.

    sudo iotrace [options] [-- COMMAND [ARGS...]]     trace, report, dump
    iotrace report FILE.jsonl...                      render saved dumps
    iotrace diff A B                                  compare two runs or labels

Errors the user can fix (tracer.errors.UserError) are one line on stderr
(made safe: tracer.text) and their exit code; a closed pipe (`iotrace ... | head`) is not a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

from tracer.cli.common import COMMANDS
from tracer.contract import ContractError, RefusedEnvironment
from tracer.errors import UserError
from tracer.text import safe


def command(name: str):
    """The run(argv, out) of a subcommand, imported now."""
    return importlib.import_module(COMMANDS[name]).run


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in COMMANDS:
            return command(argv[0])(argv[1:], sys.stdout)
        from tracer.cli import trace

        return trace.run(argv, sys.stdout)
    except UserError as exc:
        print(f"iotrace: {safe(exc)}", file=sys.stderr)     # it may quote a path, a label, a comm
        return exc.exit_code
    except (RefusedEnvironment, ContractError) as exc:     # the latter: a BPF source tree that is not whole
        print(f"iotrace: {safe(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # reader went away (iotrace ... | head): not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
