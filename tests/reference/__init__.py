"""The ground-truth reference iotrace is tested against; not part of the product.

It records every block event in a private tracefs instance, stamped by its
own BPF programs (stamps.bpf.c), matches them into exact per-request
latencies and compares iotrace's dumps with them.  tests/ is on sys.path
(pyproject's pytest `pythonpath`; scripts/verify.py adds it), so it is
imported as `from reference import groundtruth`.
"""
