/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tasks.h - the contract between bpf/tasks.bpf.c (per-process I/O wait, file
 * reads, page-cache misses, fsync and dirty-page throttling; its page-cache
 * and ext4 handlers in bpf/pagecache.bpf.h) and tracer/sources/tasks.py: the
 * maps' layouts.  The constants and reason codes are bpf/contract.toml's
 * [tasks] part (tasks_defs.h); the kernel members and raw tracepoints these
 * programs read are its [[iotrace.kernel]] scopes ["tasks"] and
 * ["tasks", <source>], each group resolved apart: a kernel without one loses
 * that counter only.
 */
#ifndef IOTRACE_TASKS_H
#define IOTRACE_TASKS_H

#include "iotrace_defs.h"	/* IOTRACE_HASH_MUL: the hashing the block programs' tables use */
#include "readpos.h"	/* one read's pages from the page cache's event, shared with the per-file rows */
#include "tasks_defs.h"	/* the constants and reason codes, written from bpf/contract.toml [tasks] */

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
 * A thread's fsync or read in progress, by tid.  The rd_ and pend_ members
 * are written in the thread's own context only (page-cache source).
 */
struct iotrace_thread {
	u64 fsync_ns;		/* in a sync syscall (or ext4_sync_file) since; 0 when not */
	u32 tgid;
	u32 flags;		/* IOTRACE_TASKS_THROTTLE_NEXT, _READING, _WAITED */
	struct iotrace_read_pos rd;	/* its last read through the page cache (readpos.h) */
	u64 pend_mapping;	/* pages added to this address_space's cache since the thread's last read batch: */
	u64 pend_pages;		/* how many, */
	u64 pend_first;		/* and the lowest page index among them */
};

/*
 * A traced thread blocked in I/O wait, from its blocking sched_switch to its
 * sched_wakeup, under its struct task_struct's address (tasks.bpf.c's wait_of):
 * two to a cache line, a probe window.
 */
struct iotrace_wait {
	u64 task;		/* the thread's struct task_struct *; 0: free */
	u64 block_ns;		/* blocked since */
	u32 tgid;		/* its process, whose row the wait is added to */
	u32 throttled;		/* 1: balance_dirty_pages' pause (THROTTLE_NEXT was set) */
};

#endif /* IOTRACE_TASKS_H */
