/* SPDX-License-Identifier: GPL-2.0 */
/* Written by `make contract` from bpf/contract.toml [iotrace], where each value is explained:
 * edit that file, not this one (tests/unit/test_contract_syntax.py compares the two). */
#ifndef IOTRACE_DEFS_H
#define IOTRACE_DEFS_H

#define IOTRACE_HIST_SUB_BITS 7
#define IOTRACE_HIST_MAX_MSB 37
#define IOTRACE_HIST_BUCKETS ((IOTRACE_HIST_MAX_MSB - IOTRACE_HIST_SUB_BITS + 2) << IOTRACE_HIST_SUB_BITS)
#define IOTRACE_HDR_SIGFIGS 2
#ifndef IOTRACE_INFLIGHT_SLOTS
#define IOTRACE_INFLIGHT_SLOTS 8192	/* power of two; see struct iotrace_slot */
#endif
#define IOTRACE_INFLIGHT_PROBES 8	/* slots per group: one cache line of tags */
#define IOTRACE_INFLIGHT_GROUPS (IOTRACE_INFLIGHT_SLOTS / IOTRACE_INFLIGHT_PROBES)
#define IOTRACE_PARTITIONS 1024	/* block_getrq starts, perf-event path: partitions mapped to their disk */
#define IOTRACE_BIO_HOPS 2
#ifndef IOTRACE_BIO_WALK
#define IOTRACE_BIO_WALK 32
#endif
#define IOTRACE_STALE_NS 60000000000ULL
#define IOTRACE_COMM_REUSE_NS 1000000000ULL
#define IOTRACE_WHO_SLOTS 64	/* per CPU, by thread id: see struct iotrace_who */
#define IOTRACE_WHO_EPOCH_PROGRAMS 0
#define IOTRACE_WHO_EPOCH_USER 1
#define IOTRACE_WHO_EPOCHS 2
#define IOTRACE_QDEV_SLOTS 16	/* per CPU, by request queue: see struct iotrace_qdev */
#define IOTRACE_QDEV_TTL_NS 1000000ULL	/* how long a queue's disk is trusted without a read */
#ifndef IOTRACE_HIST_CELLS
#define IOTRACE_HIST_CELLS 16384	/* power of two: per-CPU fast histogram cells (the least default) */
#endif
#define IOTRACE_HIST_CELLS_MOST 65536
#define IOTRACE_HIST_CELLS_BUDGET 1048576
#define IOTRACE_HIST_CELL_PROBES 4	/* open-addressing window of the cells */
#define IOTRACE_HIST_CELL_RUN 4	/* neighbouring buckets per run of cells: one cache line */
#ifndef IOTRACE_CPUS
#define IOTRACE_CPUS 1	/* possible CPUs: parts of the cell array */
#endif
#ifndef IOTRACE_HIST_ENTRIES
#define IOTRACE_HIST_ENTRIES 65536	/* buckets that found no cell, per interval */
#endif
#ifndef IOTRACE_SERIES_ENTRIES
#define IOTRACE_SERIES_ENTRIES 16384	/* (pid, dev, op) per interval */
#endif
#define IOTRACE_SERIES_CELLS 256	/* per CPU and generation: series in a plain array (struct iotrace_series_cell) */
#define IOTRACE_SERIES_CELL_PROBES 2	/* open-addressing window of the series cells */
#define IOTRACE_PID_ENTRIES 65536
#define IOTRACE_DEV_ENTRIES 256
#define IOTRACE_WB_INODES 16384	/* inodes whose last dirtier is kept (LRU): see struct iotrace_dirtier */
#define IOTRACE_WB_THREADS 256	/* threads writing back a traced dirtier's inode at once */
#define IOTRACE_COMM_LEN 16
#ifndef IOTRACE_FILE_ENTRIES
#define IOTRACE_FILE_ENTRIES 4096	/* (dev, ino, tgid) file rows per interval: see struct iotrace_file_val */
#endif
#define IOTRACE_FILE_NAMES 8192	/* files whose dentry names are kept (LRU): see struct iotrace_file_name */
#define IOTRACE_FILE_READERS 1024	/* threads whose last page-cache read range is kept (LRU) */
#define IOTRACE_FILE_HIST_SUB_BITS 2	/* a file's latency buckets: 4 per power of two (within 12.5%) */
#define IOTRACE_FILE_HIST_BUCKETS ((IOTRACE_HIST_MAX_MSB - IOTRACE_FILE_HIST_SUB_BITS + 2) << IOTRACE_FILE_HIST_SUB_BITS)
#define IOTRACE_NAME_LEN 32	/* bytes kept of one path component */
#define IOTRACE_NAME_DEPTH 4	/* path components kept, the file's own name first */
#ifndef IOTRACE_PAGE_SHIFT
#define IOTRACE_PAGE_SHIFT 12	/* the page cache's page size */
#endif
#define IOTRACE_SECTOR_SIZE 512
#define IOTRACE_OP_WB 0x80
#define IOTRACE_OP_BIO 0x40
#define IOTRACE_OP_WINDOW_SHIFT 8
#define IOTRACE_OP_WINDOW_BITS 24
#define IOTRACE_OP_CODE_MASK 0xFF
#define IOTRACE_HASH_MUL 0x9E3779B97F4A7C15ULL	/* Fibonacci hashing */

enum iotrace_op {
	IOTRACE_OP_READ = 0,
	IOTRACE_OP_WRITE = 1,
	IOTRACE_OP_FLUSH = 2,
	IOTRACE_OP_DISCARD = 3,
	IOTRACE_OP_OTHER = 4,
	IOTRACE_OP_COUNT = 5,
};

enum iotrace_phase {
	IOTRACE_PHASE_QUEUE = 0,	/* start to issue (~Q2D) */
	IOTRACE_PHASE_DEVICE = 1,	/* issue to completion (D2C) */
	IOTRACE_PHASE_TOTAL = 2,	/* start to completion (~Q2C) */
	IOTRACE_PHASE_COUNT = 3,
};

enum iotrace_reason {
	IOTRACE_DROP_INFLIGHT_FULL = 0,	/* no free slot for a starting request */
	IOTRACE_DROP_NO_START = 1,	/* completion of a request never seen starting */
	IOTRACE_DROP_HIST_FULL = 2,	/* histogram map full: a latency sample lost */
	IOTRACE_DROP_SERIES_FULL = 3,	/* series map full: a whole completion lost */
	IOTRACE_DROP_PID_FULL = 4,	/* a forked child could not join the filter */
	IOTRACE_DROP_CLAMPED = 5,	/* latency beyond the top bucket (kept there) */
	IOTRACE_NOTE_INTERNAL_FLUSH = 6,	/* the flush machinery's own request */
	IOTRACE_NOTE_FLUSH_TAIL = 7,	/* zero-byte end of a flush sequence */
	IOTRACE_NOTE_MERGED = 8,	/* request merged into another before issue */
	IOTRACE_NOTE_FRONT_MERGE = 9,	/* request start moved by a front merge */
	IOTRACE_NOTE_PARTIAL = 10,	/* partial completion, request goes on */
	IOTRACE_NOTE_REQUEUE = 11,	/* request requeued by the driver */
	IOTRACE_NOTE_UNTRACKED = 12,	/* completion of a request a filter left out */
	IOTRACE_NOTE_RECLAIMED = 13,	/* a stale in-flight slot reused (see IOTRACE_STALE_NS) */
	IOTRACE_NOTE_HIST_OVERFLOW = 14,	/* a bucket found no free cell: counted in the hash map */
	IOTRACE_NOTE_CLOCK_SKEW = 15,	/* two CPUs' clocks disagreed: a phase taken as 0 */
	IOTRACE_DROP_KERNEL_READ = 16,	/* a read of a kernel struct failed (raw path): its request is lost */
	IOTRACE_DROP_NESTED = 17,	/* a completion interrupted another's accounting on its CPU */
	IOTRACE_DROP_LOST_COMPLETION = 18,	/* raw path: a request object started again, its last completion unseen (counted when its next life ends) */
	IOTRACE_NOTE_WB_UNKEPT = 19,	/* a dirtier or a flusher's inode not kept (map full, read failed): its write-back stays the flusher's */
	IOTRACE_DROP_FILES_FULL = 20,	/* a file row not kept (map full): its bytes are in no file row (its request is in its series) */
	IOTRACE_NOTE_FILE_UNREAD = 21,	/* a file's inode or name could not be read: its request stays in its series, in no file row */
	IOTRACE_DROP_BIO_WALK = 22,	/* --bio: a request ended more bios than its completion reads (IOTRACE_BIO_WALK): theirs lost */
	IOTRACE_NOTE_OWN_START = 23,	/* --stamps kernel: a request the kernel gave no start stamp (no RQF_IO_STAT: iostats turned off since), timed from its start event */
	IOTRACE_NOTE_REBOUND = 24,	/* a request object's in-flight slot, its last life ended, given to another key */
	IOTRACE_REASON_COUNT = 25,
};

#endif /* IOTRACE_DEFS_H */
