// SPDX-License-Identifier: GPL-2.0
/*
 * writeback.bpf.h - write-back under its writer, the events' side: who
 * dirtied an inode (writeback_dirty_folio, in the dirtier's context) and
 * which inode a flusher thread is writing back (between
 * writeback_single_inode_start and writeback_single_inode).  The maps
 * (wb_inodes, wb_threads, wb_busy) and the request side (wb_writing,
 * wb_charge: a flusher's request is its inode's last traced dirtier's) are
 * in core.bpf.h; each path file includes this after it and wraps these in
 * its programs.  A dirtier carries the window it dirtied in (wb_window,
 * which user space moves on at every window's cut with the generation): the
 * request side puts it in the op's upper bits (IOTRACE_OP_WINDOW_SHIFT), so
 * a later write-back's bytes are credited to the window that wrote them.
 *
 * Beside that, what the traced processes dirtied and the kernel has not
 * written back yet (wb_owed), for the run's end (tracer.sources.owed): the
 * targets have exited, is there write-back of theirs still to trace?  The
 * simplest exact account the events allow, per inode: the bytes of each
 * folio a traced process dirties are added (writeback_dirty_folio fires
 * once per clean->dirty folio, so a rewrite of a dirty folio adds nothing);
 * the pages a flusher writes (writeback_single_inode's nr_to_write -
 * wbc->nr_to_write) are taken off; and the inode leaves the map when it is
 * clean: its write-back wrote less than it was allowed (no dirty page was
 * left in it), or all it owed (wb_written), or a whole-file fsync of it ended (raw tracepoints, ext4:
 * the caller wrote its pages itself).  All of it runs on those events,
 * never on a request's.
 */
#ifndef IOTRACE_WRITEBACK_BPF_H
#define IOTRACE_WRITEBACK_BPF_H

/* [0] -> u32: the sequence number of the window being recorded (1 the first; user space, MapDrain.flip) */
BPF_ARRAY(wb_window, u32, 1);

static __always_inline u32 wb_current_window(void)
{
	u32 zero = 0, *w = wb_window.lookup(&zero);

	return w ? *w & ((1U << IOTRACE_OP_WINDOW_BITS) - 1) : 0;
}

/* inode key -> struct iotrace_owed: bytes a traced process dirtied there, not written back yet */
BPF_TABLE("lru_hash", u64, struct iotrace_owed, wb_owed, IOTRACE_WB_INODES);

/* `bytes` more of the inode `inode` dirtied by the traced process `tgid` */
static __always_inline void wb_owe(u64 inode, u32 tgid, u64 bytes)
{
	struct iotrace_owed *o = wb_owed.lookup(&inode), no = {};

	if (o) {
		o->tgid = tgid;
		__sync_fetch_and_add(&o->bytes, bytes);
		return;
	}
	no.tgid = tgid;
	no.bytes = bytes;
#ifdef IOTRACE_K_INODE_SB
	{	/* raw tracepoints: the key is the inode's address; its device, for --dev (once per inode) */
		u64 sb = 0;

		if (!bpf_probe_read_kernel(&sb, sizeof(sb), (const void *)(inode + IOTRACE_K_INODE_SB)) && sb)
			bpf_probe_read_kernel(&no.dev, sizeof(no.dev), (const void *)(sb + IOTRACE_K_SB_DEV));
	}
#endif
	if (wb_owed.update(&inode, &no))
		count_reason(IOTRACE_NOTE_WB_UNKEPT);
}

/*
 * The inode `inode`'s write-back (writeback_single_inode) ended: `wrote` of
 * the `allowed` pages it might write were written.  Fewer than allowed: it
 * had no dirty page left, nothing of it is owed.  Else what it wrote is off,
 * and once that is all it owed the entry goes too: background write-back
 * hands an inode chunks of whole MiB (writeback_chunk_size), so a file of
 * such a size is written in passes that each write all they may, and no end
 * says it is clean (seen on 6.1: 32 MiB in eight passes of 1024 pages).
 */
static __always_inline void wb_written(u64 inode, long allowed, long wrote)
{
	struct iotrace_owed *o = inode ? wb_owed.lookup(&inode) : 0;
	u64 off;

	if (!o)
		return;
	off = wrote > 0 ? (u64)wrote << IOTRACE_PAGE_SHIFT : 0;
	if (wrote < allowed || off >= o->bytes) {
		wb_owed.delete(&inode);
		return;
	}
	o->bytes -= off;
}

/* A folio of `bytes` of the inode `inode` (its key) was dirtied, in the dirtier's context. */
static __always_inline void wb_dirtied(u64 inode, u64 bytes)
{
	u64 id = bpf_get_current_pid_tgid(), now;
	struct iotrace_dirtier nd = {}, *d;
	u32 window;
	struct iotrace_who *w;

	/* a flusher dirtying as it writes back is no writer */
	if (!inode || wb_writing((u32)id))
		return;
	if (!task_wanted(id >> 32)) {
		/* the last dirtier is untraced: this inode's write-back is no traced process's */
		if (wb_inodes.lookup(&inode))
			wb_inodes.delete(&inode);
		if (wb_owed.lookup(&inode))	/* its write-back is charged to no traced process now */
			wb_owed.delete(&inode);
		return;
	}
	wb_owe(inode, id >> 32, bytes);
	now = bpf_ktime_get_ns();
	window = wb_current_window();
	d = wb_inodes.lookup(&inode);
	/* the same writer lately, in the same window: nothing new (a process dirties many folios in a row) */
	if (d && d->tid == (u32)id && d->window == window && now - d->ns < IOTRACE_COMM_REUSE_NS)
		return;
	nd.tgid = id >> 32;
	nd.tid = (u32)id;
	nd.ns = now;
	nd.window = window;
	w = who_is(id, now);
	if (w) {
		nd.cgroup = w->cgroup;
		__builtin_memcpy(nd.comm, w->comm, sizeof(nd.comm));
	} else {
		nd.cgroup = bpf_get_current_cgroup_id();
		bpf_get_current_comm(nd.comm, sizeof(nd.comm));
	}
	if (d)
		*d = nd;
	else if (wb_inodes.update(&inode, &nd))
		count_reason(IOTRACE_NOTE_WB_UNKEPT);
}

/* The current thread stops writing back an inode (or never did: then this is one array read). */
static __always_inline void wb_end(void)
{
	u32 tid = bpf_get_current_pid_tgid(), zero = 0, *busy = wb_busy.lookup(&zero);

	if (busy && *busy && wb_threads.delete(&tid) == 0)
		__sync_fetch_and_add(busy, -1);	/* BPF has no atomic sub */
}

/*
 * The current thread (a flusher) starts writing back the inode `inode`:
 * until wb_end() its requests are its last traced dirtier's.  Not when the
 * dirtier's own process writes it back itself (a filesystem's fsync that
 * goes through writeback_single_inode): that I/O stays its direct I/O.
 */
static __always_inline void wb_begin(u64 inode)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, zero = 0, *busy;
	struct iotrace_dirtier *d, copy, *old;

	wb_end();	/* an end never seen (attached in between): not the previous inode's any more */
	d = inode ? wb_inodes.lookup(&inode) : 0;
	if (!d || d->tgid == id >> 32)
		return;
	copy = *d;
	busy = wb_busy.lookup(&zero);
	if (!busy)
		return;
	if (wb_threads.insert(&tid, &copy) == 0) {
		__sync_fetch_and_add(busy, 1);
		return;
	}
	old = wb_threads.lookup(&tid);	/* another program of this thread's put one there meanwhile */
	if (old)
		*old = copy;
	else
		count_reason(IOTRACE_NOTE_WB_UNKEPT);
}

#endif /* IOTRACE_WRITEBACK_BPF_H */
