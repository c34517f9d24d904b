"""`python -m tracer.cli ...`: the iotrace command (what the installed `iotrace` script runs)."""

import sys

from tracer.cli import main

sys.exit(main())
