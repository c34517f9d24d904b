/* SPDX-License-Identifier: GPL-2.0 */
/*
 * iotrace.h - the contract between iotrace's BPF programs and its Python side.
 *
 * Everything both sides must agree on is defined here once: the bucket
 * scheme, the op / phase / drop-reason codes, the map sizes and the
 * key/value layouts of every map.  The Python side (tracer/contract.py)
 * parses the #defines and enums below, and takes the struct layouts from
 * bcc, which compiles this very file; no number is typed twice.
 *
 * Rules for editing, so that tracer/contract.py keeps parsing it:
 *   - constants are "#define IOTRACE_NAME <integer or expression of them>";
 *   - enums list "NAME = <integer>," one per line and end with a *_COUNT.
 */
#ifndef IOTRACE_H
#define IOTRACE_H

/*
 * Latency buckets: log-linear, in nanoseconds.  Values below 2^SUB_BITS get
 * a bucket each; above, every power of two is split into 2^SUB_BITS equal
 * sub-buckets, so a bucket is at most 1/128 of its lower bound wide and a
 * percentile read at the bucket's midpoint is within 0.4% of the truth.
 *
 * The index is exactly HdrHistogram's counts index for lowest value 1,
 * 2 significant figures (256 sub-buckets, half of them per power of two)
 * and highest value 2^(MAX_MSB+1) - 1 ns (about 275 s): the kernel's
 * buckets encode into a standard HdrHistogram without any re-binning.
 * Latencies beyond the top are counted in the top bucket and in
 * IOTRACE_DROP_CLAMPED.
 */
#define IOTRACE_HIST_SUB_BITS 7
#define IOTRACE_HIST_MAX_MSB 37
#define IOTRACE_HIST_BUCKETS ((IOTRACE_HIST_MAX_MSB - IOTRACE_HIST_SUB_BITS + 2) << IOTRACE_HIST_SUB_BITS)
#define IOTRACE_HDR_SIGFIGS 2

/* Map capacities; tracer/sources/probe.py may override the ones IOTRACE_OVERRIDE_TABLE lists as TUNABLE. */
#ifndef IOTRACE_INFLIGHT_SLOTS
#define IOTRACE_INFLIGHT_SLOTS 8192	/* power of two; see the slot below */
#endif
#define IOTRACE_INFLIGHT_PROBES 8	/* slots per group: one cache line of tags */
#define IOTRACE_INFLIGHT_GROUPS (IOTRACE_INFLIGHT_SLOTS / IOTRACE_INFLIGHT_PROBES)
#define IOTRACE_PARTITIONS 1024	/* block_getrq starts, perf-event path: partitions mapped to their disk */
/* block_getrq starts: bios before rq->bio searched for the start (a front merge puts one there) */
#define IOTRACE_BIO_HOPS 2
/*
 * --bio: bios a request's completion looks at, its first ones (a request of merged bios may hold more).
 * The loader tries BIO_WALKS in turn: an older verifier (6.1's) gives up on the longest walk's paths.
 */
#ifndef IOTRACE_BIO_WALK
#define IOTRACE_BIO_WALK 32
#endif
/* a slot this old whose completion never came (the kernel skipped it) may be reused */
#define IOTRACE_STALE_NS 60000000000ULL
/* a thread's comm and cgroup, read on this CPU less than this ago, are taken as still right */
#define IOTRACE_COMM_REUSE_NS 1000000000ULL
#define IOTRACE_WHO_SLOTS 64		/* per CPU, by thread id: see struct iotrace_who */
#define IOTRACE_QDEV_SLOTS 16		/* per CPU, by request queue: see struct iotrace_qdev */
#define IOTRACE_QDEV_TTL_NS 1000000ULL	/* how long a queue's disk is trusted without a read */
#ifndef IOTRACE_HIST_CELLS
#define IOTRACE_HIST_CELLS 16384	/* power of two: per-CPU fast histogram cells */
#endif
#define IOTRACE_HIST_CELL_PROBES 4	/* open-addressing window of the cells */
#define IOTRACE_HIST_CELL_RUN 4	/* neighbouring buckets per run of cells: one cache line */
#ifndef IOTRACE_CPUS
#define IOTRACE_CPUS 1		/* possible CPUs: parts of the cell array */
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
#define IOTRACE_WB_INODES 16384		/* inodes whose last dirtier is kept (LRU): see struct iotrace_dirtier */
#define IOTRACE_WB_THREADS 256		/* threads writing back a traced dirtier's inode at once */
#define IOTRACE_COMM_LEN 16
#ifndef IOTRACE_FILE_ENTRIES
#define IOTRACE_FILE_ENTRIES 4096	/* (dev, ino, tgid) file rows per interval: see struct iotrace_file_val */
#endif
#define IOTRACE_FILE_NAMES 8192		/* files whose dentry names are kept (LRU): see struct iotrace_file_name */
#define IOTRACE_FILE_READERS 1024	/* threads whose last page-cache read range is kept (LRU) */
#define IOTRACE_FILE_HIST_SUB_BITS 2	/* a file's latency buckets: 4 per power of two (within 12.5%) */
#define IOTRACE_FILE_HIST_BUCKETS ((IOTRACE_HIST_MAX_MSB - IOTRACE_FILE_HIST_SUB_BITS + 2) << IOTRACE_FILE_HIST_SUB_BITS)
#define IOTRACE_NAME_LEN 32		/* bytes kept of one path component */
#define IOTRACE_NAME_DEPTH 4		/* path components kept, the file's own name first */
#ifndef IOTRACE_PAGE_SHIFT
#define IOTRACE_PAGE_SHIFT 12		/* the page cache's page size */
#endif
#define IOTRACE_SECTOR_SIZE 512

/*
 * The constants above that user space may set (-DIOTRACE_<NAME>=<value>;
 * each is defined under #ifndef): read by tracer/contract.py, never compiled.
 *   TUNABLE(NAME)      a map size an option may change (tracer/sources/probe.py)
 *   SET_BY_USER(NAME)  a fact of the running machine, always passed
 */
#ifdef IOTRACE_OVERRIDE_TABLE
TUNABLE(INFLIGHT_SLOTS)
TUNABLE(HIST_CELLS)
TUNABLE(HIST_ENTRIES)
TUNABLE(SERIES_ENTRIES)
TUNABLE(FILE_ENTRIES)
SET_BY_USER(CPUS)
SET_BY_USER(PAGE_SHIFT)
SET_BY_USER(BIO_WALK)
#endif

/* What a request did, from the rwbs string at its start. */
enum iotrace_op {
	IOTRACE_OP_READ = 0,
	IOTRACE_OP_WRITE = 1,
	IOTRACE_OP_FLUSH = 2,
	IOTRACE_OP_DISCARD = 3,
	IOTRACE_OP_OTHER = 4,
	IOTRACE_OP_COUNT = 5,
};
/* or'ed into a slot's, series key's and histogram key's op: a request the kernel's flusher wrote
 * back for an inode a traced process dirtied, charged to that process (see struct iotrace_dirtier) */
#define IOTRACE_OP_WB 0x80
/* or'ed into the op of an I/O timed as it was submitted (--bio): a bio on a request-based disk, from
 * block_bio_queue to its completion, a row of its own beside its process's requests (struct iotrace_bio_dev) */
#define IOTRACE_OP_BIO 0x40
/*
 * and, above the mark, on a write-back request: the window its data was dirtied in (struct
 * iotrace_dirtier's `window`, IOTRACE_OP_WINDOW_BITS of it), so that its bytes are credited there.  The
 * histogram key's op is a u8: it keeps the op and the mark only, a request's latency stays in the window
 * it ran in.  An op's code and mark alone: op & IOTRACE_OP_CODE_MASK.
 */
#define IOTRACE_OP_WINDOW_SHIFT 8
#define IOTRACE_OP_WINDOW_BITS 24
#define IOTRACE_OP_CODE_MASK 0xFF

/* The three latencies of a request, named after blktrace's intervals. */
enum iotrace_phase {
	IOTRACE_PHASE_QUEUE = 0,	/* start to issue (~Q2D) */
	IOTRACE_PHASE_DEVICE = 1,	/* issue to completion (D2C) */
	IOTRACE_PHASE_TOTAL = 2,	/* start to completion (~Q2C) */
	IOTRACE_PHASE_COUNT = 3,
};

/*
 * Events that could not be recorded, or were deliberately set aside, each
 * counted.  The Python side reports any non-zero IOTRACE_DROP_* as lost; the
 * IOTRACE_NOTE_* ones are bookkeeping that loses nothing.
 */
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
	IOTRACE_DROP_LOST_COMPLETION = 18,	/* raw path: a request object started again, its last completion unseen */
	IOTRACE_NOTE_WB_UNKEPT = 19,	/* a dirtier or a flusher's inode not kept (map full, read failed): its write-back stays the flusher's */
	IOTRACE_DROP_FILES_FULL = 20,	/* a file row not kept (map full): its bytes are in no file row (its request is in its series) */
	IOTRACE_NOTE_FILE_UNREAD = 21,	/* a file's inode or name could not be read: its request stays in its series, in no file row */
	IOTRACE_DROP_BIO_WALK = 22,	/* --bio: a request ended more bios than its completion reads (IOTRACE_BIO_WALK): theirs lost */
	IOTRACE_NOTE_OWN_START = 23,	/* --stamps kernel: a request the kernel gave no start stamp (no RQF_IO_STAT: iostats turned off since), timed from its start event */
	IOTRACE_REASON_COUNT = 24,
};

#define IOTRACE_HASH_MUL 0x9E3779B97F4A7C15ULL	/* Fibonacci hashing */

/*
 * What the raw-tracepoint programs read of the kernel.  bcc applies no
 * CO-RE relocation, and the header tree it compiles against may be another
 * kernel's, so tracer/sources/kernel.py looks every entry up in the running
 * kernel's BTF at start, names whatever is missing, and passes the values
 * as -DIOTRACE_K_<NAME>=<value>.  The block is never compiled: it is read
 * by tracer/contract.py, one entry per line.
 *   KMEMBER(NAME, struct, member[.member], bytes)  byte offset of a member the
 *                                                  programs read as `bytes`.  A
 *                                                  NAME listed again: an older
 *                                                  kernel's form of it, the first
 *                                                  the kernel has is taken and
 *                                                  IOTRACE_K_<NAME>_ERA says which
 *                                                  (0 the first); a KHEAD spans
 *                                                  only the forms in its struct
 *   KENUM(NAME, enumerator)                        an enumerator's value
 *   KHEAD(NAME, struct, MEMBER_NAME...)            bytes from the struct's start
 *                                                  to the end of the last of
 *                                                  these members: one read
 *   KRAWTP(event, argument types...)               a raw tracepoint and its
 *                                                  arguments as the programs
 *                                                  take them (ctx->args[i]), up
 *                                                  to the last one read.  An
 *                                                  event listed again in one
 *                                                  table: another kernel era's
 *                                                  prototype, the first the
 *                                                  kernel has is taken, and
 *                                                  IOTRACE_K_<EVENT>_LAST is the
 *                                                  index of its last argument
 *   KBIT(NAME, struct, member)                     a one-bit bitfield: the byte
 *                                                  holding it (NAME) and its mask
 *                                                  there (NAME_MASK); resolved
 *                                                  only for the programs that ask
 *                                                  (tracer.sources.kernel.resolve_bits)
 *   KSCOPE(program[, part[, arch]])               which programs read the
 *                                                  entries that follow, up to
 *                                                  the next KSCOPE
 * KSCOPE(block) (the start): the block-layer programs' (raw_tp.bpf.c);
 * KSCOPE(block, <event>): that event's program's own, resolved only where it
 * is attached (a kernel without them loses that program's feature: the bio
 * programs fall back to the perf-event path, an optional event is left out;
 * an optional event's are resolved alone, so its KHEADs name its own members);
 * KSCOPE(block, stamps) theirs too, only with --stamps kernel (IOTRACE_KERNEL_STAMPS):
 * a kernel without one keeps iotrace's own stamps, said at start.
 * KSCOPE(tasks): read by the per-process programs (tracer/sources/tasks.py)
 * only; KSCOPE(tasks, syscalls) only by their raw sys_enter/sys_exit
 * variant, which falls back to the syscalls' perf-event tracepoints when
 * one is missing.  KSCOPE(tasks, syscalls, <arch>) (the register names of
 * struct pt_regs, arch as platform.machine() spells it) is that
 * architecture's alone; one without entries for the running architecture
 * takes the fallback too.  KSCOPE(tasks, <source>) (reads, cache, fsync,
 * throttled) is read by that source's programs only: a kernel that lacks
 * one loses that source (said "unavailable" in every dump), not the
 * per-process rows.
 */
#ifdef IOTRACE_KERNEL_TABLE
KSCOPE(block)
KMEMBER(RQ_Q, request, q, 8)
KMEMBER(RQ_CMD_FLAGS, request, cmd_flags, 4)
KMEMBER(RQ_DATA_LEN, request, __data_len, 4)
KMEMBER(RQ_PART, request, part, 8)
KMEMBER(RQ_SECTOR, request, __sector, 8)	/* the ground-truth stamper only */
KMEMBER(RQ_DISK, request_queue, disk, 8)	/* a request's disk, rq->q->disk (RQ_DISK_ERA 0) */
KMEMBER(RQ_DISK, request, rq_disk, 8)	/* or rq->rq_disk (1: 5.10), read in the head (compat.bpf.h) */
KMEMBER(DISK_MAJOR, gendisk, major, 4)
KMEMBER(DISK_FIRST_MINOR, gendisk, first_minor, 4)	/* read with major: must follow it */
KMEMBER(RQ_BIO, request, bio, 8)	/* block_getrq starts, files (in the completion's head read) and the ground-truth stamper */
KMEMBER(BIO_NEXT, bio, bi_next, 8)	/* block_getrq starts only (and the ground-truth stamper) */
KMEMBER(BIO_SECTOR, bio, bi_iter.bi_sector, 8)	/* the ground-truth stamper only (block_getrq starts) */
KMEMBER(TASK_PID, task_struct, pid, 4)
KENUM(REQ_OP_READ, REQ_OP_READ)
KENUM(REQ_OP_WRITE, REQ_OP_WRITE)
KENUM(REQ_OP_FLUSH, REQ_OP_FLUSH)
KENUM(REQ_OP_DISCARD, REQ_OP_DISCARD)
KENUM(REQ_OP_SECURE_ERASE, REQ_OP_SECURE_ERASE)
KENUM(REQ_OP_BITS, __REQ_FAILFAST_DEV)	/* the flag bits begin right above the op bits */
KENUM(REQ_PREFLUSH, __REQ_PREFLUSH)
KHEAD(RQ_HEAD_LEN, request, RQ_Q, RQ_CMD_FLAGS, RQ_DATA_LEN, RQ_PART, RQ_BIO, RQ_DISK)	/* at completion */
KRAWTP(block_io_start, struct request *)
KRAWTP(block_getrq, struct bio *)
KRAWTP(block_getrq, struct request_queue *, struct bio *)	/* 5.10's (q, bio, rw): the bio is the last read */
KRAWTP(block_rq_insert, struct request *)
KRAWTP(block_rq_issue, struct request *)
KRAWTP(block_rq_complete, struct request *, blk_status_t, unsigned int)
KRAWTP(block_rq_complete, struct request *, int, unsigned int)	/* 5.10's error is an int (not read) */
KRAWTP(block_rq_merge, struct request *)
KRAWTP(block_rq_requeue, struct request *)
KRAWTP(block_bio_queue, struct bio *)
KRAWTP(block_bio_complete, struct request_queue *, struct bio *)
KRAWTP(sched_process_fork, struct task_struct *, struct task_struct *)
KRAWTP(sched_process_exit, struct task_struct *)
KRAWTP(writeback_dirty_folio, struct folio *, struct address_space *)
KRAWTP(writeback_dirty_page, struct page *, struct address_space *)	/* its name before 5.17 */
KRAWTP(writeback_single_inode_start, struct inode *)
KRAWTP(writeback_single_inode, struct inode *, struct writeback_control *, long unsigned int)
KMEMBER(MAPPING_HOST, address_space, host, 8)	/* a dirtied folio's inode */
KMEMBER(WBC_NR_TO_WRITE, writeback_control, nr_to_write, 8)	/* what an inode's write-back had left to write: wb_owed */
KRAWTP(ext4_sync_file_exit, struct inode *, int)	/* wb_owed: an fsync wrote the file's dirty pages */
KMEMBER(BIO_IO_VEC, bio, bi_io_vec, 8)	/* files: a request's first page */
KMEMBER(BVEC_PAGE, bio_vec, bv_page, 8)	/* files */
KMEMBER(PAGE_MAPPING, page, mapping, 8)	/* files: low bit set for anonymous memory */
KMEMBER(INODE_SB, inode, i_sb, 8)	/* files */
KMEMBER(INODE_INO, inode, i_ino, 8)	/* files */
KMEMBER(INODE_SIZE, inode, i_size, 8)	/* files */
KMEMBER(INODE_DENTRY, inode, i_dentry.first, 8)	/* files: the inode's first dentry's d_u.d_alias */
KMEMBER(SB_DEV, super_block, s_dev, 4)	/* files */
KMEMBER(SB_BDEV, super_block, s_bdev, 8)	/* files: 0 for a file system on no block device (shmem, tmpfs) */
KMEMBER(DENTRY_ALIAS, dentry, d_u.d_alias, 16)	/* files */
KMEMBER(DENTRY_NAME, dentry, d_name.name, 8)	/* files */
KMEMBER(DENTRY_PARENT, dentry, d_parent, 8)	/* files */
KMEMBER(TASK_NVCSW, task_struct, nvcsw, 8)	/* files: a reader blocked since its last batch (readpos.h) */
KHEAD(INODE_HEAD_LEN, inode, INODE_SB, INODE_INO, INODE_SIZE)	/* files: one read */
KRAWTP(mm_filemap_get_pages, struct address_space *, long unsigned int, long unsigned int)	/* files: Linux 6.11+ */
KRAWTP(iomap_dio_rw_begin, struct kiocb *, struct iov_iter *, unsigned int, size_t)	/* files: O_DIRECT (ext4, xfs, ...) */
KRAWTP(sched_process_exec, struct task_struct *, pid_t, struct linux_binprm *)
KSCOPE(block, block_bio_queue)
KMEMBER(BIO_BDEV, bio, bi_bdev, 8)
KMEMBER(BIO_OPF, bio, bi_opf, 4)
KMEMBER(BIO_SIZE, bio, bi_iter.bi_size, 4)
KMEMBER(BDEV_DEV, block_device, bd_dev, 4)
KHEAD(BIO_HEAD_LEN, bio, BIO_BDEV, BIO_OPF, BIO_SIZE)
KMEMBER(BIO_REMAINING, bio, __bi_remaining, 4)	/* --bio: a split bio's parts not yet done, itself included */
KMEMBER(BIO_PRIVATE, bio, bi_private, 8)	/* --bio: a split part's bio (bio_chain) */
KHEAD(BIO_WALK_LEN, bio, BIO_NEXT, BIO_SIZE, BIO_REMAINING, BIO_PRIVATE)	/* --bio: a completion's walk */
KSCOPE(block, writeback_dirty_folio)
KMEMBER(WB_FOLIO_FLAGS, folio, flags, 8)	/* a dirtied folio's size (wb_owed): PG_head, a large folio */
KMEMBER(WB_FOLIO_FLAGS_1, folio, _flags_1, 8)	/* a dirtied large folio's order (wb_owed) */
KENUM(WB_PG_HEAD, PG_head)	/* wb_owed */
KSCOPE(block, iomap_dio_rw_begin)
KMEMBER(KIOCB_FILP, kiocb, ki_filp, 8)	/* files: O_DIRECT */
KMEMBER(KIOCB_POS, kiocb, ki_pos, 8)	/* files: O_DIRECT, a read clipped at EOF */
KMEMBER(FILP_INODE, file, f_inode, 8)	/* files: O_DIRECT */
KMEMBER(ITER_COUNT, iov_iter, count, 8)	/* files: O_DIRECT's bytes */
KMEMBER(ITER_SOURCE, iov_iter, data_source, 1)	/* files: O_DIRECT, true for a write */
KSCOPE(block, stamps)
KMEMBER(RQ_FLAGS, request, rq_flags, 4)	/* RQF_IO_STAT, RQF_STATS: which stamps this request's life has */
KMEMBER(RQ_START_NS, request, start_time_ns, 8)	/* set with RQF_IO_STAT by blk_account_io_start (iostats on); else stale */
KMEMBER(RQ_IO_START_NS, request, io_start_time_ns, 8)	/* set at each issue with RQF_STATS */
KENUM(RQF_IO_STAT, __RQF_IO_STAT)	/* the RQF_* are enumerators on newer kernels; #defines on older ones (6.1): */
KENUM(RQF_STATS, __RQF_STATS)	/* kernel stamps unavailable there */
KHEAD(RQ_STAMPED_HEAD_LEN, request, RQ_Q, RQ_CMD_FLAGS, RQ_DATA_LEN, RQ_PART, RQ_BIO, RQ_DISK, RQ_FLAGS, RQ_START_NS, RQ_IO_START_NS)	/* at completion */
KSCOPE(tasks)
KMEMBER(TASK_TGID, task_struct, tgid, 4)
KMEMBER(TASK_FILES, task_struct, files, 8)
KMEMBER(FILES_FDT, files_struct, fdt, 8)
KMEMBER(FDT_MAX_FDS, fdtable, max_fds, 4)
KMEMBER(FDT_FD, fdtable, fd, 8)
KMEMBER(FILE_INODE, file, f_inode, 8)
KMEMBER(INODE_MODE, inode, i_mode, 2)
KBIT(TASK_IN_IOWAIT, task_struct, in_iowait)
KRAWTP(sched_switch, bool, struct task_struct *, struct task_struct *, unsigned int)
KRAWTP(sched_switch, bool, struct task_struct *, struct task_struct *)	/* 5.10: no prev_state, read from prev */
KMEMBER(TASK_STATE, task_struct, __state, 4)	/* prev's state, where sched_switch does not pass it */
KMEMBER(TASK_STATE, task_struct, state, 8)	/* its older form (5.10), a long */
KRAWTP(sched_wakeup, struct task_struct *)
KSCOPE(tasks, throttled)
KRAWTP(balance_dirty_pages, struct bdi_writeback *, struct dirty_throttle_control *, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long int)	/* (wb, dtc, ..., pause) */
KRAWTP(balance_dirty_pages, struct bdi_writeback *, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long unsigned int, long int)	/* before the dtc argument (Debian 12's 6.1): (wb, thresh, ..., period, pause) */
KSCOPE(tasks, syscalls)
KRAWTP(sys_enter, struct pt_regs *, long int)
KRAWTP(sys_exit, struct pt_regs *, long int)
KSCOPE(tasks, syscalls, x86_64)
KMEMBER(REGS_ARG0, pt_regs, di, 8)	/* a syscall's first argument */
KMEMBER(REGS_NR, pt_regs, orig_ax, 8)	/* the syscall's number */
KMEMBER(TASK_TI_STATUS, task_struct, thread_info.status, 4)	/* TS_COMPAT */
KSCOPE(tasks, reads)
KRAWTP(mm_filemap_get_pages, struct address_space *, long unsigned int, long unsigned int)	/* a buffered read's batch */
KMEMBER(INODE_SIZE, inode, i_size, 8)	/* a read's range clipped at EOF */
KSCOPE(tasks, cache)
KRAWTP(mm_filemap_add_to_page_cache, struct folio *)	/* a folio added (a miss, when a read follows) */
KMEMBER(FOLIO_FLAGS, folio, flags, 8)	/* PG_head, a large folio */
KMEMBER(FOLIO_FLAGS_1, folio, _flags_1, 8)	/* a large folio's order */
KMEMBER(FOLIO_MAPPING, folio, mapping, 8)
KMEMBER(FOLIO_INDEX, folio, index, 8)	/* the first page a thread added, for a read's untraced first batch */
KENUM(PG_HEAD, PG_head)
KSCOPE(tasks, fsync)
KRAWTP(ext4_sync_file_enter, struct file *, int)
KRAWTP(ext4_sync_file_exit, struct inode *, int)
#endif

/*
 * The events the block-layer programs attach to: the one list that
 * tracer/sources/probe.py derives what it attaches, checks and reports from
 * (read by tracer/contract.py, never compiled).  One line an event:
 *   EVENT(tracepoint, category, short name, paths, when, fields)
 * short name: its skipped events (the program's recursion misses) are
 *   reported as "skipped_<short name>"; paths: the attach paths with a
 *   program on it (raw_tp.bpf.c's RAW_TRACEPOINT_PROBE, tracepoint.bpf.c's
 *   TRACEPOINT_PROBE); when: always, start (the first of these the kernel has
 *   is the request start: IOTRACE_START_EVENT), bio (only when a bio-based
 *   disk is traced: IOTRACE_BIO_LEVEL) or present (only where the kernel has
 *   it: IOTRACE_HAVE_<EVENT>, upper case, defined for the programs), dirty
 *   (the first of these the kernel has is where a traced process dirties a
 *   page: writeback_dirty_folio, or writeback_dirty_page, its name before
 *   upstream b9b0ff61eef5, Linux 5.17: IOTRACE_DIRTY_PAGE is defined for
 *   the older, whose raw program counts a page where the newer reads the
 *   folio's size); fields: what the perf-event program
 *   reads of the tracepoint's format (checked at start; "-" for none).  A
 *   raw tracepoint's arguments are its KRAWTP line above.
 * The starts, newest first: block_io_start (Linux 6.5+, in
 * blk_mq_bio_to_request); block_getrq (every request made from a bio, in the
 * submitter's context right before it: the start then travels with the bio,
 * IOTRACE_START_BIO); block_rq_insert (only requests that pass a scheduler:
 * kept to compare with, $IOTRACE_START_EVENT chooses it).
 */
#ifdef IOTRACE_EVENT_TABLE
EVENT(block_io_start, block, start, raw_tp tracepoint, start, dev sector bytes rwbs)
EVENT(block_getrq, block, start, raw_tp tracepoint, start, dev sector nr_sector rwbs)
EVENT(block_rq_insert, block, start, raw_tp tracepoint, start, dev sector bytes rwbs)
EVENT(block_rq_issue, block, issue, raw_tp tracepoint, always, dev sector bytes rwbs)
EVENT(block_rq_complete, block, complete, raw_tp tracepoint, always, dev sector nr_sector rwbs)
EVENT(block_rq_merge, block, merge, raw_tp tracepoint, always, dev sector bytes)
EVENT(block_bio_frontmerge, block, frontmerge, tracepoint, always, dev sector nr_sector)
EVENT(block_rq_requeue, block, requeue, raw_tp tracepoint, always, dev)
EVENT(sched_process_fork, sched, fork, raw_tp tracepoint, always, -)
EVENT(sched_process_exit, sched, exit, raw_tp tracepoint, always, -)
EVENT(writeback_dirty_folio, writeback, wb_dirty, raw_tp tracepoint, dirty, name ino)
EVENT(writeback_dirty_page, writeback, wb_dirty, raw_tp tracepoint, dirty, name ino)
EVENT(writeback_single_inode_start, writeback, wb_start, raw_tp tracepoint, always, name ino)
EVENT(writeback_single_inode, writeback, wb_end, raw_tp tracepoint, always, name ino nr_to_write wrote)
EVENT(sched_process_exec, sched, exec, raw_tp tracepoint, always, -)
EVENT(mm_filemap_get_pages, filemap, file_read, raw_tp, present, -)
EVENT(iomap_dio_rw_begin, iomap, file_direct, raw_tp, present, -)
EVENT(ext4_sync_file_exit, ext4, wb_fsync, raw_tp, present, -)
EVENT(block_bio_queue, block, bio_queue, raw_tp tracepoint, bio, dev sector nr_sector rwbs)
EVENT(block_bio_complete, block, bio_complete, raw_tp tracepoint, bio, dev sector nr_sector rwbs)
#endif

/*
 * One request between its start and its completion.  The in-flight table
 * is an array of these, in groups of IOTRACE_INFLIGHT_PROBES chosen by a
 * hash of the request's key (its address on raw tracepoints, its (dev,
 * sector) on perf-event ones); a parallel array of 64-bit tags (the
 * address, or a fingerprint of (dev, sector); 0 when free) is what a lookup scans, and a slot is claimed with
 * a compare-and-swap on its tag, so the hot path takes no lock and
 * allocates nothing.  A request whose home group is full goes to a second
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
 * after IOTRACE_COMM_REUSE_NS, so a rename (exec, prctl) or a move to
 * another cgroup shows within that.
 */
struct iotrace_who {
	u32 tid;
	u32 execs;		/* the exec count (core's `execs`) when comm was read */
	u64 ns;			/* when comm and cgroup were read */
	u64 cgroup;
	char comm[IOTRACE_COMM_LEN];
};

/*
 * A request queue's disk, as the raw completion program last read it on
 * this CPU (rq->q->disk->major/first_minor: two kernel reads per request).  An
 * array of IOTRACE_CPUS * IOTRACE_QDEV_SLOTS indexed by a hash of the
 * queue's address.  The entry must match the queue and the request's
 * partition (struct block_device) and be under IOTRACE_QDEV_TTL_NS old:
 * for another disk to show up at both addresses, the old disk must have
 * been removed and both objects freed (after RCU grace periods) and reused
 * within that millisecond of its last I/O.
 */
struct iotrace_qdev {
	u64 q;			/* struct request_queue * */
	u64 part;		/* struct block_device * of the request that filled it */
	u64 ns;			/* when read */
	u32 dev;		/* the whole disk's dev_t */
	u32 pad;
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
