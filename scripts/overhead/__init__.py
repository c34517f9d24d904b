"""The overhead bench (scripts/bench_overhead.py) as a package the scripts call.

    overhead.tracers    the tracers under test (Tracer: why_not, start, stop), TRACERS, make_tracers
    overhead.programs   the machine's BPF programs
    overhead.run        workloads, the interleaved IOPS pass and the bpf_stats pass on a scratch loop
                        device (tracer.testing.scratch_loop), Result
    overhead.report     the medians, the issue's targets (verdict) and the table
"""
