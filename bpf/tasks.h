/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tasks.h - the contract between bpf/tasks.bpf.c (per-process I/O wait, file
 * reads, page-cache misses, fsync and dirty-page throttling; its page-cache
 * and ext4 handlers in bpf/pagecache.bpf.h) and tracer/sources/tasks.py.
 *
 * Same rules as iotrace.h, whose parser (tracer/contract.py) reads this file
 * too: constants are "#define IOTRACE_NAME <integer>", enums list
 * "NAME = <integer>," one per line and end with a *_COUNT.  The kernel
 * members and raw tracepoints these programs read are in iotrace.h's
 * IOTRACE_KERNEL_TABLE (under KSCOPE(tasks); each event source's own
 * entries under KSCOPE(tasks, <source>), each group resolved apart: a
 * kernel without one loses that counter only).
 */
#ifndef IOTRACE_TASKS_H
#define IOTRACE_TASKS_H

#include "readpos.h"	/* one read's pages from the page cache's event, shared with the per-file rows */

#define IOTRACE_TASKS_ENTRIES 16384	/* processes with counters (exited ones go at the next drain) */
#define IOTRACE_TASKS_THREADS 65536	/* threads with a wait in progress, or that had one */
#define IOTRACE_TASKS_PIDS 65536	/* the traced processes, when a pid filter is set */
#define IOTRACE_TASKS_COMM_LEN 16
#define IOTRACE_TASKS_S_IFMT 0xF000	/* inode mode: file type bits (stat.h, fixed by POSIX) */
#define IOTRACE_TASKS_S_IFREG 0x8000	/* regular file */

/* Thread flags (struct iotrace_thread.flags). */
#define IOTRACE_TASKS_THROTTLE_NEXT 1	/* balance_dirty_pages said it will sleep: the next I/O wait is throttling */
#define IOTRACE_TASKS_THROTTLED 2	/* the I/O wait in progress is dirty-page throttling */
#define IOTRACE_TASKS_READING 4	/* in a read syscall on a regular file */
#define IOTRACE_TASKS_WAITED 8	/* blocked in I/O wait since its last read batch (page-cache source: readpos.h) */

/* The page cache's own numbers (fixed by the kernel's folio layout, include/linux/mm.h folio_order) */
#define IOTRACE_TASKS_FOLIO_ORDER_MASK 0xff	/* folio._flags_1: the order of a large folio */

/*
 * x86_64: thread_info.status bit of a task inside a 32-bit (ia32) syscall,
 * whose number is from the 32-bit table (arch/x86/include/asm/thread_info.h
 * TS_COMPAT; a #define, so not in BTF; 0x0002 since 2.6.x).  The raw
 * sys_enter program skips such syscalls, as the perf-event syscall
 * tracepoints do (trace_get_syscall_nr() is -1 for them).
 */
#define IOTRACE_TASKS_X86_TS_COMPAT 0x0002

/* What could not be recorded, each counted (per CPU, never reset). */
enum iotrace_tasks_reason {
	IOTRACE_TASKS_DROP_TASKS_FULL = 0,	/* no room for a process: its counters lost */
	IOTRACE_TASKS_DROP_THREADS_FULL = 1,	/* no room for a thread: a wait or fsync lost */
	IOTRACE_TASKS_DROP_PIDS_FULL = 2,	/* a forked child could not join the filter */
	IOTRACE_TASKS_DROP_KERNEL_READ = 3,	/* a read of a kernel struct failed: its event lost */
	IOTRACE_TASKS_REASON_COUNT = 4,
};

/* Global switches, written by user space: array map of one entry. */
struct iotrace_tasks_config {
	u32 enabled;		/* 0 until user space has written the filter */
	u32 filter_pids;	/* 1: only tgids in the tpids map */
	u32 follow_children;	/* 1: forks of traced processes join it */
	u32 pad;
};

/*
 * A process's counters since it was first seen, by tgid; never reset (user
 * space takes differences).  Updated with atomic adds: its threads run on
 * several CPUs.  An exited process (exit_ns set) is deleted by user space
 * once it has read it.
 */
struct iotrace_task {
	u64 io_wait_ns;		/* threads blocked in I/O wait (in_iowait), block to wakeup */
	u64 io_waits;
	u64 read_bytes;		/* read from regular files: the syscalls' returns (--tasks), else the ranges of buffered reads (mm_filemap_get_pages, clipped at EOF) */
	u64 reads;
	u64 read_pages;		/* pages of those ranges (page-cache source only) */
	u64 missed_pages;	/* pages its reads added to the page cache (readahead of a miss; page-cache source only) */
	u64 fsync_ns;		/* in fsync, fdatasync, sync_file_range (--tasks), else ext4_sync_file */
	u64 fsyncs;
	u64 throttle_ns;	/* blocked by balance_dirty_pages */
	u64 throttles;
	u64 first_ns;		/* when the entry was made */
	u64 exit_ns;		/* when its last thread exited; 0 while alive */
	u32 ppid;		/* parent's tgid when forked while traced; 0 unknown */
	u32 pad;
	char comm[IOTRACE_TASKS_COMM_LEN];
};

/*
 * A thread's wait, fsync or read in progress, by tid.  The rd_ and pend_
 * members are written in the thread's own context only (page-cache source).
 */
struct iotrace_thread {
	u64 block_ns;		/* blocked in I/O wait since; 0 when not */
	u64 fsync_ns;		/* in a sync syscall (or ext4_sync_file) since; 0 when not */
	u32 tgid;
	u32 flags;		/* IOTRACE_TASKS_THROTTLE_NEXT, _THROTTLED, _READING */
	struct iotrace_read_pos rd;	/* its last read through the page cache (readpos.h) */
	u64 pend_mapping;	/* pages added to this address_space's cache since the thread's last read batch: */
	u64 pend_pages;		/* how many, */
	u64 pend_first;		/* and the lowest page index among them */
};

#endif /* IOTRACE_TASKS_H */
