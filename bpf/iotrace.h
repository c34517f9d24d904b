/* SPDX-License-Identifier: GPL-2.0 */
/*
 * iotrace.h - the contract between iotrace's BPF programs and its Python side:
 * the key/value layouts of every map.
 *
 * What both sides must agree on besides (the bucket scheme, the op / phase /
 * drop-reason codes, the map sizes, the kernel members the programs read and
 * the events they attach to) is written once, in bpf/contract.toml: the
 * Python side reads it (tracer/contract.py), and its constants and codes
 * reach C as the generated iotrace_defs.h included below.  The struct
 * layouts are read from bcc, which compiles this very file; no number is
 * typed twice.
 */
#ifndef IOTRACE_H
#define IOTRACE_H

/*
 * The constants and codes (the bucket scheme, map sizes, op / phase / reason
 * codes), written from bpf/contract.toml, where each is explained.
 */
#include "iotrace_defs.h"

/* The tags of one group of slots (the tags map's value): what a lookup scans, one cache line. */
struct iotrace_tags {
	u64 tag[IOTRACE_INFLIGHT_PROBES];	/* the slot's key (address or fingerprint), 0 when free */
};

/*
 * One request between its start and its completion.  The in-flight table
 * is an array of these, in groups of IOTRACE_INFLIGHT_PROBES chosen by a
 * hash of the request's key (its address on raw tracepoints, its (dev,
 * sector) on perf-event ones); a parallel array of 64-bit tags (the
 * address, or a fingerprint of (dev, sector); 0 when free) is what a lookup
 * scans, and a slot is claimed with a compare-and-swap on its tag, so the
 * hot path takes no lock and allocates nothing.  A request object's address
 * stays its slot's tag between its lives, and the slot is taken while its
 * `life` differs from its `ended` (core.bpf.h says why: what a start reads,
 * no completion writes).  A request whose home group is full goes to a second
 * group chosen by another part of the hash (counted in the spills map, so
 * that lookups look there only when something did): a start is lost only
 * when both groups are full.  With N requests in flight among G groups that
 * happens to a start with probability about P(Poisson(N/G) >= 8) squared:
 * with the default 1024 groups ~1e-10 at 1024 in flight (a million
 * requests a second at 1 ms each lose nothing; the home group alone lost
 * ~10 per million), ~1e-6 at 2048.  A bigger table costs more cache misses
 * (measured: ~50-140 ns more per request at 32768 slots), so it is the
 * user's call (--inflight-slots).
 */
struct iotrace_slot {
	u32 dev;		/* kernel dev_t as the tracepoint gives it */
	u32 op;			/* enum iotrace_op */
	u64 sector;		/* perf-event path: current start sector (moves on front merge / partial); raw: the request's address */
	u64 start_ns;		/* block_io_start */
	u64 issue_ns;		/* last block_rq_issue, 0 if never issued */
	u64 cgroup;		/* submitter's cgroup v2 id */
	u32 tgid;		/* submitter's process */
	u32 tid;		/* submitter's thread */
	u32 remaining;		/* bytes not yet completed (raw path: bytes at the start) */
	u32 done;		/* bytes completed so far */
	u32 life;		/* the slot's count of lives started (its lives entry) as of this one */
	u32 ended;		/* lives of the slot ended: it is taken while this differs from life */
	char comm[IOTRACE_COMM_LEN];	/* submitter's comm */
};

/*
 * A disk (or a partition of one) whose bios are timed, the bio_devs map's
 * value: bio-based disks (zram, device-mapper, md: no requests to time),
 * and with --bio (IOTRACE_BIO_SUBMITTED) request-based ones too, each bio
 * as submitted, its splits and the wait for its request included.
 */
struct iotrace_bio_dev {
	u32 disk;		/* the whole disk's dev_t, which its rows are recorded under */
	u32 mark;		/* 0 for a bio-based disk, IOTRACE_OP_BIO for a request-based one's bios */
};

/*
 * Who a thread is, as a start program last read it on this CPU: reading
 * comm and the cgroup id costs two helper calls per request, and a thread
 * that issues I/O usually issues more.  An array of IOTRACE_CPUS *
 * IOTRACE_WHO_SLOTS, each CPU's part indexed by tid; an entry is read again
 * after IOTRACE_COMM_REUSE_NS, so a rename (prctl) or a move to another
 * cgroup shows within that, and at once after an exec or a change of the
 * pid filter's members anywhere (core's `who_epochs`).  Whether the pid
 * filter holds the thread's process is kept too: a lookup in the `pids`
 * hash costs a request start ~60-75 ns (docs/costs.md).
 */
struct iotrace_who {
	u32 tid;
	u32 epoch;		/* who_epochs[IOTRACE_WHO_EPOCH_PROGRAMS] when read */
	u64 ns;			/* when comm and cgroup were read */
	u64 cgroup;
	char comm[IOTRACE_COMM_LEN];
	u32 user_epoch;		/* who_epochs[IOTRACE_WHO_EPOCH_USER] when read */
	u32 in_pids;		/* enum iotrace_who_pids */
};

/* struct iotrace_who's pid filter verdict; NOT_READ: there was no pid filter when it was read */
enum iotrace_who_pids {
	IOTRACE_WHO_PIDS_NOT_READ = 0,
	IOTRACE_WHO_PIDS_IN = 1,
	IOTRACE_WHO_PIDS_OUT = 2,
};

/*
 * A request queue's disk, as the raw completion program last read it on
 * this CPU (rq->q->disk->major/first_minor: two kernel reads per request).  An
 * array of IOTRACE_CPUS * IOTRACE_QDEV_SLOTS indexed by a hash of the
 * queue's address.  The entry must match the queue and the request's
 * partition (struct block_device) and be under IOTRACE_QDEV_TTL_NS old:
 * for another disk to show up at both addresses, the old disk must have
 * been removed and both objects freed (after RCU grace periods) and reused
 * within that millisecond of its last I/O.  With it, whether --dev traces
 * that disk: the filter's verdict without its hash lookup on each request
 * (measured: docs/costs.md).
 */
struct iotrace_qdev {
	u64 q;			/* struct request_queue * */
	u64 part;		/* struct block_device * of the request that filled it */
	u64 ns;			/* when read */
	u32 dev;		/* the whole disk's dev_t */
	u32 wanted;		/* enum iotrace_qdev_wanted: dev_wanted(dev) when read */
};

/* struct iotrace_qdev's verdict; NOT_YET: read before the filters were written (tracing enabled) */
enum iotrace_qdev_wanted {
	IOTRACE_QDEV_NOT_YET = 0,
	IOTRACE_QDEV_WANTED = 1,
	IOTRACE_QDEV_UNWANTED = 2,
};

/*
 * Write-back under its writer.  A folio is dirtied in the writing
 * process's context (writeback_dirty_folio); its inode is written back
 * later by the kernel's flusher, between writeback_single_inode_start and
 * writeback_single_inode in that kworker's context, where the block
 * requests start.  So: inode -> its last traced dirtier (an LRU of
 * IOTRACE_WB_INODES, keyed by the inode's address on raw tracepoints, by a
 * hash of (bdi name, ino) on perf-event ones); flusher thread -> the
 * dirtier of the inode it is writing back (IOTRACE_WB_THREADS); a request
 * a thread in that state starts is the dirtier's, its op marked
 * IOTRACE_OP_WB and the window it dirtied the inode in (IOTRACE_OP_WINDOW_SHIFT).
 * An untraced dirtier removes the inode's entry: the last dirtier, and its
 * last window, win (an inode dirtied in two windows before its write-back is
 * credited to the later one).  fsync and sync_file_range write in the caller's context,
 * outside that window: their requests stay the caller's.
 */
struct iotrace_dirtier {
	u32 tgid;
	u32 tid;
	u64 cgroup;
	u64 ns;			/* when its comm and cgroup were read */
	char comm[IOTRACE_COMM_LEN];
	u32 window;		/* the window (wb_window) it last dirtied the inode in; 0: unknown */
	u32 pad;
};

/* Bytes of an inode that a traced process dirtied and no write-back has written yet (writeback.bpf.h) */
struct iotrace_owed {
	u32 tgid;		/* its last traced dirtier */
	u32 dev;		/* its file system's dev_t (kernel encoding; raw tracepoints), 0 where unknown */
	u64 bytes;
};

/*
 * Files: a row per (file, process) and interval, in files0/files1 by the
 * generation (bpf/files.bpf.h).  A file is its superblock's dev_t and its
 * inode number.  Bytes from disk and written are a block request's, the
 * request's file the inode of its first bio's first page (a page-cache
 * page: buffered reads, write-back, fsync; not O_DIRECT's user pages), its
 * process the request's (write-back: the dirtier's); O_DIRECT's are the
 * bytes asked at iomap_dio_rw_begin, with no request; bytes read through the
 * page cache are mm_filemap_get_pages' ranges (whole pages, clipped at the
 * file's size), counted once per read.  Updated with atomics: the rows are
 * shared by the CPUs.
 */
struct iotrace_file_key {
	u32 dev;		/* the file's superblock's dev_t (kernel encoding) */
	u32 tgid;
	u64 ino;
};

struct iotrace_file_val {
	u64 cache_bytes;	/* read through the page cache (whole pages, clipped at EOF) */
	u64 disk_read_bytes;	/* read requests' bytes */
	u64 written_bytes;	/* write requests' bytes, write-back included */
	u64 requests;		/* read and write requests (page-cache pages: not O_DIRECT's) */
	u64 direct_bytes;	/* of disk_read_bytes and written_bytes: O_DIRECT's, as asked (iomap_dio_rw_begin) */
	u64 sum_ns;		/* their total latencies */
	u64 cgroup;		/* of the last process context seen */
	char comm[IOTRACE_COMM_LEN];
	u32 hist[IOTRACE_FILE_HIST_BUCKETS];	/* total latency, buckets of IOTRACE_FILE_HIST_SUB_BITS */
};

/*
 * A file's dentry name as read when its row was first made: part i (at
 * i * IOTRACE_NAME_LEN, NUL-terminated) its own name for i = 0, then its
 * parents'.  One flat array: bcc's map types mishandle arrays of arrays.
 */
struct iotrace_file_name {
	u32 depth;		/* parts read */
	u32 rooted;		/* 1: part depth-1's parent is the filesystem's root */
	char part[IOTRACE_NAME_DEPTH * IOTRACE_NAME_LEN];
};

/* Global switches, written by user space: array map of one entry. */
struct iotrace_config {
	u32 gen;		/* histogram generation being written: 0 or 1 */
	u32 filter_pids;	/* 1: only tgids in the pids map are traced */
	u32 follow_children;	/* 1: forks of traced tgids join the pids map */
	u32 per_thread;		/* 1: series keyed by thread id, not tgid */
	u32 filter_devs;	/* 1: only devices in the devs map are traced */
	u32 enabled;		/* 0 until user space has written the filters */
	u32 cgroup_level;	/* depth of filter_cgroup below the cgroup v2 root */
	u32 pad;
	u64 filter_cgroup;	/* non-zero: only I/O submitted in this cgroup v2 or below it */
	u64 tick_base;		/* IOTRACE_START_TICK_NS: jiffies * tick + this is CLOCK_MONOTONIC (tracer/sources/ticks.py) */
};

/* Histogram map key -> u64 count (per CPU, one map per generation). */
struct iotrace_hist_key {
	u32 pid;		/* tgid, or tid with per_thread */
	u32 dev;
	u16 bucket;		/* 0 .. IOTRACE_HIST_BUCKETS-1 */
	u8 op;			/* enum iotrace_op */
	u8 phase;		/* enum iotrace_phase */
};

/*
 * Histogram cell: the fast path for bucket counts.  Each CPU has
 * IOTRACE_HIST_CELLS of these, indexed by a hash of the key with a short
 * probe: a hash table the program walks without a helper call, a lock or
 * an atomic (programs do not nest on a CPU).  The CPUs' parts sit in one
 * plain array (IOTRACE_CPUS of them, set by user space) rather than a
 * per-CPU array, whose elements are separate allocations reached through
 * a pointer table: neighbouring cells then share cache lines for real.
 * count == 0 marks a free cell; user space zeroes the cells it drains.  A
 * key that finds no cell goes to the hist hash map instead.
 */
struct iotrace_hist_cell {
	struct iotrace_hist_key key;
	u32 count;		/* this CPU's samples in this interval */
};

/* Series map key: one row of the report. */
struct iotrace_series_key {
	u32 pid;
	u32 dev;
	u32 op;
};

/* Series map value (per CPU, one map per generation). */
struct iotrace_series_val {
	u64 count;		/* completed requests */
	u64 bytes;		/* bytes completed */
	u64 sum_ns[IOTRACE_PHASE_COUNT];
	u64 min_ns[IOTRACE_PHASE_COUNT];	/* 0 when this CPU saw none */
	u64 max_ns[IOTRACE_PHASE_COUNT];
	u64 phase_count[IOTRACE_PHASE_COUNT];	/* flushes have no queue/device split */
	u64 last_ns;		/* completion time of the last request on this CPU: whose identity is latest */
	u64 cgroup;		/* cgroup id of the last submitter */
	u32 tgid;		/* process of the last submitter */
	u32 pad;
	char comm[IOTRACE_COMM_LEN];	/* comm of the last submitter */
};

/*
 * Series cell: the fast path for a series' value.  Each CPU has
 * IOTRACE_SERIES_CELLS of these per generation, indexed by a hash of the key
 * with a short probe, in one plain array (as struct iotrace_hist_cell, and
 * for the same reasons): a completion finds its series with no helper call.
 * val.count == 0 marks a free cell; user space zeroes the cells it drains.
 * A key that finds no cell goes to the series hash map, as before: a
 * series may then be in a cell on one CPU and in the hash on another (never
 * both on one CPU within a generation: cells are not evicted), and user
 * space adds the two.
 */
struct iotrace_series_cell {
	struct iotrace_series_key key;
	u32 pad;
	struct iotrace_series_val val;
};

#endif /* IOTRACE_H */
