/* SPDX-License-Identifier: GPL-2.0 */
/*
 * compat.bpf.h - every kernel difference the BPF programs know of, one
 * block each: the kernel that made it (where it could be confirmed, the
 * upstream commit), what the loader decides from it, and the macros the
 * programs use for it.  Pasted into raw_tp.bpf.c, tracepoint.bpf.c and
 * tasks.bpf.c (tracer/sources/bpfobject.py source()).
 *
 * Nothing here is measured at run time: the loader (tracer/sources/kernel.py
 * from the running kernel's BTF, tracer/sources/probe.py and tasks.py from
 * it and the tracepoints' format files) defines the IOTRACE_HAVE_* /
 * IOTRACE_START_* / IOTRACE_K_*_LAST macros, and these blocks turn them into
 * code.  Only macros (and tag_cas(), which takes a map value's address):
 * they expand inside the programs, so ctx and args stay the program's own
 * (bcc rewrites nothing behind a helper's argument), and
 * where a difference guards whole programs the #ifdef stays at the program,
 * with a pointer here, since bcc and tests/unit/test_events.py want every
 * program in its source file's own text.
 */
#ifndef IOTRACE_COMPAT_BPF_H
#define IOTRACE_COMPAT_BPF_H

/*
 * The request start.  block_io_start(rq), fired in blk_mq_bio_to_request()
 * in the submitter's context, came with upstream 5a80bd075f3b ("block:
 * introduce block_io_start/block_io_done tracepoints"), Linux 6.5 (a 6.4.8
 * kernel lacks it).  Before it the start is block_getrq(bio), right before
 * the bio becomes the request's first: the loader defines IOTRACE_START_BIO,
 * the start is kept under the bio's address (raw) or its partition's
 * (dev, sector) (perf-event) until the request shows.  block_rq_insert (only
 * requests that pass a scheduler) is kept to compare with.  The loader
 * substitutes IOTRACE_START_EVENT / IOTRACE_START_CATEGORY.
 * Stays at the programs: raw_tp.bpf.c's start program, bio_start_of(),
 * start_from_bio() and block_rq_issue / block_rq_requeue; tracepoint.bpf.c's
 * start program and its parts map.
 *
 * start_held_by_bio(rq, r): with block_getrq starts, a request never issued
 * (merged away, or an empty flush the flush machinery finished) still has
 * its start under one of its bios; without, there is nothing to look for.
 */
#ifdef IOTRACE_START_BIO
#define start_held_by_bio(rq, r) bio_start_of(rq, r)
#else
#define start_held_by_bio(rq, r) false
#endif

/*
 * sched_process_exit's group_dead: the tracepoint took (task) only, until
 * upstream 3e816361e94a ("sched/tracepoints: Move and extend the
 * sched_process_exit() tracepoint"), Linux 6.16, added (task, bool
 * group_dead), and the field of the same name.  The loader
 * defines IOTRACE_HAVE_GROUP_DEAD from the BTF prototype (raw paths,
 * tracer/sources/kernel.py resolve()) or the format file (perf-event path).
 *
 * raw_group_dead(ctx), tp_group_dead(args): whether a thread group died,
 * false where the kernel does not say (core.bpf.h on_exit() then deletes
 * only the exiting thread's own pid-filter entry).
 * raw_process_exit(ctx, tid, tgid): the per-process rows want an exit either
 * way, so without group_dead the leader's exit stands for the process's.
 */
#ifdef IOTRACE_HAVE_GROUP_DEAD
#define raw_group_dead(ctx) ((ctx)->args[1] & 1)
#define tp_group_dead(args) ((args)->group_dead)
#define raw_process_exit(ctx, tid, tgid) raw_group_dead(ctx)
#else
#define raw_group_dead(ctx) false
#define tp_group_dead(args) false
#define raw_process_exit(ctx, tid, tgid) ((tid) == (tgid))
#endif

/*
 * balance_dirty_pages' prototype: upstream f1ab2831e2a4 ("writeback: let
 * trace_balance_dirty_pages() take struct dtc as parameter") replaced the
 * five limits (thresh, bg_thresh, dirty, bdi_thresh, bdi_dirty) with one
 * struct dirty_throttle_control *: Linux 6.15 (and 6.14-stable from April
 * 2025, as a dependency of a fix).  Debian 12's 6.1 has the old one.  contract.toml lists both prototypes up to pause and
 * tracer/sources/kernel.py passes IOTRACE_K_BALANCE_DIRTY_PAGES_LAST, the
 * index of pause in the one this kernel has.
 */
#define bdp_pause(ctx) ((long)(ctx)->args[IOTRACE_K_BALANCE_DIRTY_PAGES_LAST])

/*
 * Raw tracepoints only some kernels have, each program under
 * IOTRACE_HAVE_<EVENT> (contract.toml's events, "present"; per-process
 * rows: tracer/sources/tasks.py choose_sources): the #ifdefs stay at the
 * programs (raw_tp.bpf.c, files.bpf.h, pagecache.bpf.h).
 *   mm_filemap_get_pages(mapping, index, last_index): from upstream
 *     b6273b55d885 ("filemap: add trace events for get_pages, map_pages, and
 *     fault"), Linux 6.12 (in the MM pull for 6.12-rc1; the hash from a
 *     bisection report).  Without it: no page-cache bytes (files, tasks).
 *   iomap_dio_rw_begin(iocb, iter, dio_flags, done_before): from upstream
 *     3fd41721cd5c ("iomap: Add DIO tracepoints"), Linux 6.4.  Without it:
 *     no O_DIRECT bytes in the file rows.
 *   ext4_sync_file_exit(inode, ret): ext4's, present wherever ext4 is built.
 */

/*
 * Large folios' order.  folio_order() reads the low byte of the first tail
 * page's flags, folio._flags_1, when PG_head is set; before upstream
 * ebc1baf5c9b4 ("mm: free up a word in the first tail page"), Linux 6.6,
 * it was a field of its own (_folio_order).  Both are
 * read at BTF offsets (IOTRACE_K_WB_FOLIO_FLAGS_1, IOTRACE_K_FOLIO_FLAGS_1),
 * so a kernel without _flags_1 fails the layout check by name.  The reads
 * stay where they are (raw_tp.bpf.c writeback_dirty_folio, pagecache.bpf.h
 * pc_folio_pages): each bounds the order for its own shift.
 */

/*
 * current_member(type, off, reason): the member of the current task at byte
 * `off` (a scalar of `type`).  Read straight from the task where the kernel
 * hands it out typed: bpf_get_current_task_btf(), upstream 3ca1032ab7ab
 * ("bpf: Add a BPF helper for getting the current task"), Linux 5.11, whose
 * pointer the verifier lets a program load from at offsets it checks
 * against the BTF (the loader defines IOTRACE_K_FUNC_CURRENT_TASK_BTF where
 * the kernel has it: contract.toml's scope ["helpers"]).  Elsewhere copied
 * by bpf_probe_read_kernel, ~50 ns dearer a read here (docs/costs.md); 0,
 * counted as `reason`, if that fails.
 */
#ifdef IOTRACE_K_FUNC_CURRENT_TASK_BTF
#define current_member(type, off, reason) (*(const type *)((const u8 *)bpf_get_current_task_btf() + (off)))
#else
#define current_member(type, off, reason) ({					\
	type v_ = 0;								\
	kread(&v_, sizeof(v_), bpf_get_current_task() + (off), (reason));	\
	v_;									\
})
#endif

/*
 * Claiming an in-flight slot.  BPF's atomic compare-and-swap and exchange
 * came with upstream 5ffa25502b5a ("bpf: Add instructions for
 * atomic_[cmp]xchg"), Linux 5.12; before it the one atomic is an add whose
 * old value is not returned.  The loader defines IOTRACE_NO_CMPXCHG where
 * the verifier refuses cmpxchg (tracer/sources/bpfobject.py has_cmpxchg()).
 *
 * tag_cas(p, old, new): *p from old to new, true for the one caller that
 * did it.  Emulated: a claimer adds its token (its CPU + 1, never 0) and
 * reads *p back; only a claimer that reads old + its own token owns the
 * tag (any other claimer's token in there makes both read a sum and back
 * out; one added after it reads something other than old), and turns it
 * into new by one more add.  A claimer nested on the same CPU sees *p is
 * not old and looks elsewhere.  Tags are kernel addresses or 64-bit
 * fingerprints, tokens at most IOTRACE_CPUS: no sum of others equals old.
 * tag_clear(p, old): free a tag the caller owns.  Emulated by subtracting
 * it, so that a claimer's token added meanwhile is not lost.
 */
#ifdef IOTRACE_NO_CMPXCHG
static __always_inline bool tag_cas(u64 *p, u64 old, u64 new)
{
	u64 token = bpf_get_smp_processor_id() + 1;

	if (*(volatile u64 *)p != old)
		return false;
	__sync_fetch_and_add(p, token);
	if (*(volatile u64 *)p != old + token) {
		__sync_fetch_and_add(p, -token);
		return false;
	}
	__sync_fetch_and_add(p, new - old - token);
	return true;
}
#define tag_clear(p, old) __sync_fetch_and_add((p), -(old))
#else
#define tag_cas(p, old, new) (__sync_val_compare_and_swap((p), (old), (new)) == (old))
#define tag_clear(p, old) __sync_lock_test_and_set((p), 0)	/* a full barrier: the slot's fields are dead once it is 0 */
#endif

/*
 * --cgroup's test.  bpf_get_current_ancestor_cgroup_id() (helper of Linux
 * 5.7) was opened to tracing programs by upstream 95b861a7935b ("bpf: Allow
 * bpf_get_current_ancestor_cgroup_id for tracing"), Linux 5.14: Debian 12's
 * 6.1 has it there, Debian 11's 5.10 refuses it; the loader defines
 * IOTRACE_NO_ANCESTOR_CGROUP where the verifier refuses it
 * (tracer/sources/bpfobject.py has_ancestor_cgroup()), and says that
 * --cgroup then traces the threads directly in the cgroup only.
 * in_filter_cgroup(cfg): the current thread is in the filter's cgroup (or
 * below it: then its ancestor at the cgroup's depth is the cgroup).
 */
#ifdef IOTRACE_NO_ANCESTOR_CGROUP
#define in_filter_cgroup(cfg) (bpf_get_current_cgroup_id() == (cfg)->filter_cgroup)
#else
#define in_filter_cgroup(cfg) (bpf_get_current_ancestor_cgroup_id((cfg)->cgroup_level) == (cfg)->filter_cgroup)
#endif

/*
 * A request's disk: rq->q->disk, or before it rq->rq_disk.  Upstream
 * d152c682f03c ("block: add an explicit ->disk backpointer to the
 * request_queue"), Linux 5.15, added the first; f3fa33acca9f ("block:
 * remove the ->rq_disk field in struct request"), Linux 5.17, removed the
 * second (Debian 11's 5.10 has rq_disk and no request_queue.disk, 6.1 the
 * reverse).  contract.toml lists both
 * forms of RQ_DISK and the loader says which this kernel has in
 * IOTRACE_K_RQ_DISK_ERA (tracer/sources/kernel.py resolve()).
 * rq_disk_of(h): the disk where the request's head holds it (era 1: the
 * head then reaches rq_disk), else 0 and raw_tp.bpf.c read_queue_dev()
 * reads it from the queue.
 */
#if IOTRACE_K_RQ_DISK_ERA
#define rq_disk_of(h) HEAD_FIELD(h, u64, IOTRACE_K_RQ_DISK)
#else
#define rq_disk_of(h) 0
#endif

/*
 * block_getrq's bio: (bio) since upstream e8a676d61c07 ("block: simplify
 * and extend the block_bio_merge tracepoint class"), Linux 5.11; (q, bio,
 * rw) before, as on Debian 11's 5.10.  contract.toml
 * lists both prototypes up to the bio, and the
 * loader passes IOTRACE_K_BLOCK_GETRQ_LAST, the bio's index, when the
 * start is block_getrq.
 */
#ifdef IOTRACE_K_BLOCK_GETRQ_LAST
#define START_BIO_ARG IOTRACE_K_BLOCK_GETRQ_LAST
#else
#define START_BIO_ARG 0
#endif

/*
 * sched_switch's prev_state: passed as its fourth argument by the patch
 * upstream fa2c3254d7cf ("sched/tracing: Don't re-read p->state when
 * emitting sched_switch event"), Linux 5.18; before it, (preempt, prev,
 * next), and tasks.bpf.c reads prev's state itself: task_struct.__state (4
 * bytes, since 2f064a59a11f "sched: Change task_struct::state", Linux
 * 5.14), or before it task_struct.state (a long, as on 5.10:
 * IOTRACE_K_TASK_STATE_ERA 1).
 * contract.toml lists both prototypes, and the loader passes
 * IOTRACE_K_SCHED_SWITCH_LAST (3 with prev_state).  Stays in tasks.bpf.c
 * (switch_prev_state()): it reads with the per-process programs' kread.
 */

/*
 * Not handled: contract.toml's [[iotrace.kernel]] lists one prototype, so on the raw
 * paths tracer/sources/kernel.py refuses such a kernel at load, naming it:
 *   - block_rq_* taking (q, rq): the request queue went with upstream
 *     a54895fa057c ("block: remove the request_queue to argument request
 *     based tracepoints"), Linux 5.11, backported to 5.10-stable in 2022
 *     (Debian's 5.10 takes (rq)); an older 5.10.y or earlier is refused.
 *     block_bio_complete still takes (q, bio).
 * writeback_dirty_page, renamed writeback_dirty_folio by upstream
 * b9b0ff61eef5 ("mm/writeback: Convert tracing writeback_page_template to
 * folios"), is handled: contract.toml's 'dirty' events, IOTRACE_DIRTY_PAGE.
 */

#endif /* IOTRACE_COMPAT_BPF_H */
