// SPDX-License-Identifier: GPL-2.0
/*
 * tracepoint.bpf.c - iotrace's programs on perf-event tracepoints, for
 * kernels without BTF.
 *
 * They read tracepoint fields only (args->...), whose layout bcc takes from
 * the running kernel's format files, so any header tree compiles to the
 * same meaning.  A request is its (dev, sector), with the heuristics that
 * takes.  The kernel runs one such program per CPU at a time and skips
 * (counting it in the program's recursion misses) an event that fires while
 * any perf-event or kprobe program runs there, ours or another tool's; a
 * completion skipped, or now and then lost without a count, leaves its slot
 * taken, which tracer/sources/probe.py finds and counts.
 *
 * The shared core is core.bpf.h; the loader compiles this file or
 * raw_tp.bpf.c, and substitutes IOTRACE_START_CATEGORY / IOTRACE_START_EVENT.
 */
#include "maps.bpf.h"
#include "compat.bpf.h"
#include "core.bpf.h"
#include "writeback.bpf.h"

/*
 * ---- perf-event tracepoints: a request is its (dev, sector) --------------
 */

/* rwbs as blk_fill_rwbs() writes it: [F]op[F][A][S][M] */
static __always_inline u32 rwbs_op(const char *rwbs, u32 bytes)
{
	char c = rwbs[0];

	if (c == 'F') {
		/* a preflush: with no data it is a flush, else look at the op */
		if (bytes == 0)
			return IOTRACE_OP_FLUSH;
		c = rwbs[1];
	}
	switch (c) {
	case 'R':
		return IOTRACE_OP_READ;
	case 'W':
		return IOTRACE_OP_WRITE;
	case 'D':
		return IOTRACE_OP_DISCARD;
	case 'F':
		return IOTRACE_OP_FLUSH;
	}
	return IOTRACE_OP_OTHER;
}

static __always_inline u64 slot_hash(const struct slot_ref *r)
{
	return key_hash(r->s->dev, r->s->sector);
}

/* Odd, so that no key's tag is 0 (free). */
static __always_inline u64 slot_tag(const struct slot_ref *r)
{
	return slot_hash(r) | 1;
}

/* Which of several requests in flight at one (dev, sector) an event is for. */
enum pick {
	PICK_FIRST,	/* any: merges, which are rare and have no order */
	PICK_UNISSUED,	/* issue: the request not issued yet, else a re-issue */
	PICK_LATEST,	/* completion: the latest issued (see block_rq_complete) */
};

/* What a lookup has found so far, over one or two groups. */
struct find_state {
	struct slot_ref best, late;
	u64 best_issue;
	bool found;
};

/* Scan one group; true when `st->best` is final (an early pick). */
static __always_inline bool scan_group(u32 base, u32 dev, u64 sector, u64 tag, bool zero_bytes, u64 now,
				       enum pick pick, struct find_state *st)
{
	u64 *t = group_tags(base);
	struct slot_ref c;

	if (!t)
		return false;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (t[i] != tag)
			continue;
		if (!ref_at(t, base, i, &c))
			break;
		if (c.s->dev != dev || c.s->sector != sector || (c.s->remaining == 0) != zero_bytes)
			continue;
		if (c.s->start_ns > now || c.s->issue_ns > now) {
			if (!st->late.s)
				st->late = c;
			continue;
		}
		if (pick == PICK_FIRST || (pick == PICK_UNISSUED && c.s->issue_ns == 0)) {
			st->best = c;
			return true;
		}
		if (!st->found || (pick == PICK_LATEST && c.s->issue_ns > st->best_issue)) {
			st->best = c;
			st->best_issue = c.s->issue_ns;
			st->found = true;
		}
	}
	return false;
}

/*
 * The slot of the request at (dev, sector) for an event at time `now`.
 * Empty flushes all sit at sector 0 with no data; zero-byte events only
 * match slots with nothing left to complete, so a flush never steals a
 * data request's slot and vice versa.  Of two requests in flight at one
 * sector, one that started or was issued after `now` (on another CPU,
 * while this program ran) is not the one this event is about; alone, it
 * is, and the CPUs' clocks differ slightly.
 */
static __always_inline bool slot_find(u32 dev, u64 sector, bool zero_bytes, u64 now, enum pick pick,
				      struct slot_ref *r)
{
	u64 h = key_hash(dev, sector), tag = h | 1;
	u32 home = group_of(h), other = second_group_of(h), *sp;
	struct find_state st = {};

	if (scan_group(home, dev, sector, tag, zero_bytes, now, pick, &st))
		goto picked;
	sp = spill_count(home);
	if (other != home && sp && *sp && scan_group(other, dev, sector, tag, zero_bytes, now, pick, &st))
		goto picked;
	if (!st.found && st.late.s) {
		/* the only match: the CPUs' clocks disagree by a little, it is no twin */
		*r = st.late;
		return true;
	}
	if (!st.found)
		return false;
picked:
	*r = st.best;
	return true;
}

/*
 * Re-key a request whose start sector moved (front merge, partial
 * completion).  Returns 0 on success; on failure the request is lost and
 * counted, since its next event could not be matched anyway.
 */
static __always_inline int slot_move(struct slot_ref *from, u64 sector)
{
	struct iotrace_slot *s = from->s;
	struct slot_ref to;

	if (!slot_claim(key_hash(s->dev, sector), key_hash(s->dev, sector) | 1, s->start_ns, &to)) {
		slot_release(from);
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return -1;
	}
	slot_copy(to.s, s);
	to.s->sector = sector;
	slot_release(from);
	return 0;
}


/* A request (or, on bio-based disks, a bio) starts, in its submitter's context. */
static __always_inline int track_start(u64 now, u32 dev, u64 sector, u32 bytes, const char *rwbs)
{
	u64 h = key_hash(dev, sector), id = bpf_get_current_pid_tgid();
	struct slot_ref r;

	if (!task_wanted(id >> 32) || !dev_wanted(dev))
		return 0;
	if (!slot_claim(h, h | 1, now, &r)) {
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return 0;
	}
	r.s->sector = sector;
	slot_fill(r.s, now, id, dev, rwbs_op(rwbs, bytes), bytes);
	return 0;
}

#ifdef IOTRACE_START_BIO
/* partition dev_t -> its whole disk's, written by the loader: block_getrq names a bio's partition */
BPF_HASH(parts, u32, u32, IOTRACE_PARTITIONS);

/*
 * block_getrq(bio), on kernels without block_io_start: every request made
 * from a bio, in the submitter's context, right before the bio becomes its
 * first.  The bio's sector is already the whole disk's (partitions are
 * remapped before), its dev is still the partition's: the request's later
 * events name the disk.
 */
TRACEPOINT_PROBE(IOTRACE_START_CATEGORY, IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = bpf_ktime_get_ns();
	u32 dev = args->dev, *disk = parts.lookup(&dev);

	return track_start(now, disk ? *disk : dev, args->sector, args->nr_sector * IOTRACE_SECTOR_SIZE, args->rwbs);
}
#else
TRACEPOINT_PROBE(IOTRACE_START_CATEGORY, IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = bpf_ktime_get_ns();

	return track_start(now, args->dev, args->sector, args->bytes, args->rwbs);
}
#endif

/* REQ_OP_FLUSH ("FF"): the kernel's own flush on behalf of queued flushes */
static __always_inline bool internal_flush(const char *rwbs)
{
	return rwbs[0] == 'F' && rwbs[1] == 'F';
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
	u64 now = bpf_ktime_get_ns();
	struct slot_ref r;

	/* it sits at sector 0 with no data, like the flushes it serves: never match it */
	if (internal_flush(args->rwbs)) {
		count_reason(IOTRACE_NOTE_INTERNAL_FLUSH);
		return 0;
	}
	/* two requests may be in flight at one sector: the unissued one is issued */
	if (!slot_find(args->dev, args->sector, args->bytes == 0, now, PICK_UNISSUED, &r))
		return 0;
	r.s->issue_ns = now;
	/* back merges grow a request between its start and its issue */
	r.s->remaining = args->bytes;
	return 0;
}

/*
 * Should two requests at one sector be in flight, the completion takes the
 * latest issued: that is right for the common case, where the other is a
 * request whose completion the kernel skipped (its stale start time must
 * not be lent to a new request), and merely swaps two similar latencies
 * for two live requests.
 */
TRACEPOINT_PROBE(block, block_rq_complete)
{
	u64 now = bpf_ktime_get_ns();
	u32 bytes = args->nr_sector * IOTRACE_SECTOR_SIZE;
	struct iotrace_slot *s;
	struct slot_ref r;

	if (internal_flush(args->rwbs))
		return 0;	/* counted at its issue */
	if (!slot_find(args->dev, args->sector, bytes == 0, now, PICK_LATEST, &r)) {
		count_unmatched(bytes == 0);
		return 0;
	}
	s = r.s;
	s->done += bytes;
	if (bytes && bytes < s->remaining) {
		/* partial completion: the rest continues from the next sector */
		s->remaining -= bytes;
		count_reason(IOTRACE_NOTE_PARTIAL);
		slot_move(&r, args->sector + args->nr_sector);
		return 0;
	}
	record(s, now);
	slot_release(&r);
	return 0;
}

TRACEPOINT_PROBE(block, block_bio_frontmerge)
{
	struct slot_ref r;

	/* the request that began right after this bio now begins at it */
	if (!slot_find(args->dev, args->sector + args->nr_sector, false, ~0ULL, PICK_FIRST, &r))
		return 0;
	count_reason(IOTRACE_NOTE_FRONT_MERGE);
	slot_move(&r, args->sector);
	return 0;
}

TRACEPOINT_PROBE(block, block_rq_merge)
{
	struct slot_ref r;

	/* this request was folded into another and will never complete */
	if (!slot_find(args->dev, args->sector, args->bytes == 0, ~0ULL, PICK_FIRST, &r))
		return 0;
	count_reason(IOTRACE_NOTE_MERGED);
	slot_release(&r);
	return 0;
}

TRACEPOINT_PROBE(block, block_rq_requeue)
{
	count_reason(IOTRACE_NOTE_REQUEUE);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
	on_fork(args->child_pid);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
	on_exec();
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	on_exit(tp_group_dead(args));
	return 0;
}

#ifndef IOTRACE_NO_WRITEBACK
/*
 * Write-back: an inode is a hash of its backing device's name and its
 * inode number, the fields both events have.
 */
static __always_inline u64 wb_inode_key(const char *name, u64 ino)
{
	u64 w[4], h = ino;

	__builtin_memcpy(w, name, sizeof(w));
#pragma unroll
	for (u32 i = 0; i < 4; i++)
		h = (h ^ w[i]) * IOTRACE_HASH_MUL;
	return (h ^ (h >> 32)) | 1;
}

/* a page dirtied: the event's name before Linux 5.17 where the loader defines IOTRACE_DIRTY_PAGE (contract.toml) */
#ifdef IOTRACE_DIRTY_PAGE
TRACEPOINT_PROBE(writeback, writeback_dirty_page)
#else
TRACEPOINT_PROBE(writeback, writeback_dirty_folio)
#endif
{
	/* the format has no folio size: a folio counts as a page here (wb_owed a lower bound with large folios) */
	wb_dirtied(wb_inode_key(args->name, args->ino), 1ULL << IOTRACE_PAGE_SHIFT);
	return 0;
}

TRACEPOINT_PROBE(writeback, writeback_single_inode_start)
{
	wb_begin(wb_inode_key(args->name, args->ino));
	return 0;
}

TRACEPOINT_PROBE(writeback, writeback_single_inode)
{
	wb_end();
	/* nr_to_write is what it was allowed, wrote what it wrote (pages) */
	wb_written(wb_inode_key(args->name, args->ino), args->nr_to_write, args->wrote);
	return 0;
}
#endif /* IOTRACE_NO_WRITEBACK */

#ifdef IOTRACE_BIO_LEVEL
/*
 * Bio-based disks (zram, device-mapper, md) have no requests: their bios
 * go straight to the driver, so they are timed from block_bio_queue to
 * block_bio_complete instead, with the total phase only.  These programs
 * are attached only when such a disk is traced; others' bios are skipped
 * at the first lookup.
 */
TRACEPOINT_PROBE(block, block_bio_queue)
{
	u64 now = bpf_ktime_get_ns();
	u32 dev = args->dev;

	if (!bio_devs.lookup(&dev))
		return 0;
	return track_start(now, dev, args->sector, args->nr_sector * IOTRACE_SECTOR_SIZE, args->rwbs);
}

TRACEPOINT_PROBE(block, block_bio_complete)
{
	u64 now = bpf_ktime_get_ns();
	u32 dev = args->dev, bytes = args->nr_sector * IOTRACE_SECTOR_SIZE;
	struct slot_ref r;

	if (!bio_devs.lookup(&dev))
		return 0;
	if (!slot_find(dev, args->sector, bytes == 0, now, PICK_FIRST, &r)) {
		count_unmatched(bytes == 0);
		return 0;
	}
	r.s->done = bytes;
	record(r.s, now);
	slot_release(&r);
	return 0;
}
#endif /* IOTRACE_BIO_LEVEL */
