/* SPDX-License-Identifier: GPL-2.0 */
/* Written by `make contract` from bpf/contract.toml [tasks], where each value is explained:
 * edit that file, not this one (tests/unit/test_contract_syntax.py compares the two). */
#ifndef IOTRACE_TASKS_DEFS_H
#define IOTRACE_TASKS_DEFS_H

#define IOTRACE_TASKS_ENTRIES 16384	/* processes with counters (exited ones go at the next drain) */
#define IOTRACE_TASKS_THREADS 65536	/* threads with a read, fsync or throttling in progress, or that had one */
#define IOTRACE_TASKS_WAITS 16384	/* power of two: entries for threads blocked in I/O wait (struct iotrace_wait); 512 KiB: with 100 blocked at once, 0.007% of waits find their window full, 1,000: 0.7% */
#define IOTRACE_TASKS_WAIT_PROBES 2	/* a task's window in waits: one cache line */
#define IOTRACE_TASKS_PIDS 65536	/* the traced processes, when a pid filter is set */
#define IOTRACE_TASKS_COMM_LEN 16
#define IOTRACE_TASKS_S_IFMT 0xF000	/* inode mode: file type bits (stat.h, fixed by POSIX) */
#define IOTRACE_TASKS_S_IFREG 0x8000	/* regular file */
#define IOTRACE_TASKS_THROTTLE_NEXT 1	/* balance_dirty_pages said it will sleep: the next I/O wait is throttling */
#define IOTRACE_TASKS_READING 4	/* in a read syscall on a regular file */
#define IOTRACE_TASKS_WAITED 8	/* blocked in I/O wait since its last read batch (page-cache source: readpos.h) */
#define IOTRACE_TASKS_FOLIO_ORDER_MASK 0xff	/* folio._flags_1: the order of a large folio */
#define IOTRACE_TASKS_X86_TS_COMPAT 0x0002

enum iotrace_tasks_reason {
	IOTRACE_TASKS_DROP_TASKS_FULL = 0,	/* no room for a process: its counters lost */
	IOTRACE_TASKS_DROP_THREADS_FULL = 1,	/* no room for a thread: a wait, read or fsync lost */
	IOTRACE_TASKS_DROP_PIDS_FULL = 2,	/* a forked child could not join the filter */
	IOTRACE_TASKS_DROP_KERNEL_READ = 3,	/* a read of a kernel struct failed: its event lost */
	IOTRACE_TASKS_DROP_WAITS_FULL = 4,	/* no free entry in a blocking thread's window of waits: that I/O wait lost */
	IOTRACE_TASKS_REASON_COUNT = 5,
};

#endif /* IOTRACE_TASKS_DEFS_H */
