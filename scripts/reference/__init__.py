"""The ground-truth reference iotrace is tested against; not part of the product.

It records every block event in a private tracefs instance, stamped by its
own BPF programs (stamps.bpf.c), matches them into exact per-request
latencies and compares iotrace's dumps with them.  It lives under scripts/,
beside its one tool, scripts/verify.py (whose own directory is on sys.path
when it runs); the tests reach it through pyproject's pytest `pythonpath`,
which lists scripts/.  Either way it is imported as
`from reference import groundtruth`.
"""
