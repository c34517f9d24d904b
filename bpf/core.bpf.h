// SPDX-License-Identifier: GPL-2.0
/*
 * core.bpf.h - what both attach paths share: the maps, the in-flight slot
 * table, the histograms, a request's accounting (record), the filters and
 * fork following.  Included once, by raw_tp.bpf.c or tracepoint.bpf.c: the
 * loader (tracer/sources/probe.py) compiles the one file its attach path
 * needs, so the other path's programs do not exist in the object at all.
 *
 * A request's life:
 *   block_io_start    submitter's context: claim an in-flight slot, note
 *                     tgid, tid, comm, cgroup and the op
 *   block_rq_issue    handed to the driver: note the time
 *   block_rq_complete account queue / device / total latency into this
 *                     CPU's histograms of the current generation, and
 *                     free the slot
 *
 * Each path file defines slot_hash() (how a slot's key is hashed: the
 * request's address, or its dev and sector) and its programs, thin
 * wrappers over the handlers here and its own request matching.
 *
 * Every program's skipped events (recursion misses) are reported by
 * tracer/sources/probe.py; everything else that goes wrong is counted here in the
 * reasons map.  User space flips the generation, waits out programs still
 * running on the old one, then drains it: intervals are exact and nothing
 * races a delete.  Keys and values live in iotrace.h, codes and sizes in contract.toml.
 *
 * The loader defines IOTRACE_BIO_LEVEL when a bio-based disk is to be
 * traced, IOTRACE_HAVE_GROUP_DEAD where sched_process_exit says whether
 * a thread group died (compat.bpf.h), and IOTRACE_NO_WRITEBACK to leave write-back
 * attribution out (its programs and the request path's look-up).
 */
#ifndef IOTRACE_CORE_BPF_H
#define IOTRACE_CORE_BPF_H

#include "iotrace.h"

/* [0] -> struct iotrace_config, written by user space */
BPF_ARRAY(config, struct iotrace_config, 1);
/* group -> struct iotrace_tags: the tags of the group's slots, one cache line (see struct slot_ref) */
BPF_ARRAY(tags, struct iotrace_tags, IOTRACE_INFLIGHT_GROUPS);
/* slot index -> u32: lives started in the slot; only starts read or write it (see struct slot_ref) */
BPF_ARRAY(lives, u32, IOTRACE_INFLIGHT_SLOTS);
/* slot index -> struct iotrace_slot: requests between start and completion */
BPF_ARRAY(inflight, struct iotrace_slot, IOTRACE_INFLIGHT_SLOTS);
/* group -> u32: requests whose home is this group that sit in their second group */
BPF_ARRAY(spills, u32, IOTRACE_INFLIGHT_GROUPS);
/* (gen * IOTRACE_CPUS + cpu) * IOTRACE_HIST_CELLS + cell -> struct iotrace_hist_cell: the fast
 * path, each generation and CPU in its own part of one plain array (see struct iotrace_hist_cell);
 * one map, not one per generation, so the programs carry one copy of the probe loop */
BPF_ARRAY(cells, struct iotrace_hist_cell, 2 * IOTRACE_CPUS * IOTRACE_HIST_CELLS);
/* struct iotrace_hist_key -> u64 count, per CPU, generation 0 / 1: keys with no cell */
BPF_PERCPU_HASH(hist0, struct iotrace_hist_key, u64, IOTRACE_HIST_ENTRIES);
BPF_PERCPU_HASH(hist1, struct iotrace_hist_key, u64, IOTRACE_HIST_ENTRIES);
/* (gen * IOTRACE_CPUS + cpu) * IOTRACE_SERIES_CELLS + cell -> struct iotrace_series_cell: the series'
 * fast path, laid out as the histogram cells are (see struct iotrace_series_cell) */
BPF_ARRAY(series_cells, struct iotrace_series_cell, 2 * IOTRACE_CPUS * IOTRACE_SERIES_CELLS);
/* struct iotrace_series_key -> struct iotrace_series_val, per CPU, generation 0 / 1: keys with no cell */
BPF_PERCPU_HASH(series0, struct iotrace_series_key, struct iotrace_series_val, IOTRACE_SERIES_ENTRIES);
BPF_PERCPU_HASH(series1, struct iotrace_series_key, struct iotrace_series_val, IOTRACE_SERIES_ENTRIES);
/* enum iotrace_reason -> u64 events, per CPU, never reset */
BPF_PERCPU_ARRAY(reasons, u64, IOTRACE_REASON_COUNT);
/* cpu * IOTRACE_WHO_SLOTS + tid % IOTRACE_WHO_SLOTS -> struct iotrace_who: a thread's comm and cgroup */
BPF_ARRAY(who, struct iotrace_who, IOTRACE_CPUS * IOTRACE_WHO_SLOTS);
/*
 * IOTRACE_WHO_EPOCH_PROGRAMS -> execs and changes the programs made to `pids`, IOTRACE_WHO_EPOCH_USER ->
 * changes user space made to `pids` (its only writer): a `who` entry read before either moved is read again
 */
BPF_ARRAY(who_epochs, u32, IOTRACE_WHO_EPOCHS);
/* tgid (or forked tid) -> 1: the processes traced when filter_pids is set */
BPF_HASH(pids, u32, u8, IOTRACE_PID_ENTRIES);
/* dev_t -> 1: the devices traced when filter_devs is set */
BPF_HASH(devs, u32, u8, IOTRACE_DEV_ENTRIES);
/* inode key -> struct iotrace_dirtier: its last traced dirtier (see iotrace.h) */
BPF_TABLE("lru_hash", u64, struct iotrace_dirtier, wb_inodes, IOTRACE_WB_INODES);
/* tid -> struct iotrace_dirtier: a flusher thread writing back a traced dirtier's inode */
BPF_HASH(wb_threads, u32, struct iotrace_dirtier, IOTRACE_WB_THREADS);
/* [0] -> u32: entries in wb_threads, so that a request start looks there only while there are some */
BPF_ARRAY(wb_busy, u32, 1);
#ifdef IOTRACE_BIO_LEVEL
/* dev_t of a disk or partition -> struct iotrace_bio_dev: the disks whose bios are timed (raw_tp.bpf.c's end) */
BPF_HASH(bio_devs, u32, struct iotrace_bio_dev, IOTRACE_DEV_ENTRIES);
#endif

static __always_inline void count_reasons(u32 reason, u64 events)
{
	u64 *n = reasons.lookup(&reason);

	/* another program may interrupt this one on the same CPU */
	if (n)
		__sync_fetch_and_add(n, events);
}

static __always_inline void count_reason(u32 reason)
{
	count_reasons(reason, 1);
}

static __always_inline struct iotrace_config *get_config(void)
{
	u32 zero = 0;

	return config.lookup(&zero);
}

/* A completion with no slot: why, as far as can be told. */
static __always_inline void count_unmatched(bool flush_tail)
{
	struct iotrace_config *cfg = get_config();

	if (!cfg || !cfg->enabled)
		return;
	if (flush_tail)
		count_reason(IOTRACE_NOTE_FLUSH_TAIL);
	else if (cfg->filter_pids || cfg->filter_devs || cfg->filter_cgroup)
		count_reason(IOTRACE_NOTE_UNTRACKED);
	else
		count_reason(IOTRACE_DROP_NO_START);
}

/* ---- the in-flight table ------------------------------------------------ */

/*
 * A request's slot is found through its tag, 0 when free: the request's
 * own address on the raw-tracepoint path, a 64-bit odd fingerprint of
 * (dev, sector) on the tracepoint path.  Its probe window is the 8 tags of
 * one aligned group, a single cache line (one map value), so a lookup
 * reads one line of tags and then only the slot that matches, not 8 slots;
 * and the second group's line only when its home group has spilled there.
 *
 * Who writes what, since a line one CPU writes and another then reads
 * costs a transfer between their caches.  Measured (scripts/bench_cost.py,
 * fio on a loop device, 2 CPUs): a start cost 140 ns when its completion,
 * often on the other CPU, had cleared the request's tag in the group the
 * next start scans, and 75 ns when nothing did; compare-and-swap or not
 * made no difference.  A start that read and wrote a count the completion
 * also read cost 140 ns again (the line moves to the reader for good: one
 * read and one write of a line look like a line that migrates); a read
 * alone or a write alone, 77-79 ns.  So:
 * - a request object's slot keeps its key, the object's address, from one
 *   life of the object to the next (the kernel reuses its requests: a few
 *   per CPU and queue at a time).  The tags are written only when a key
 *   takes a slot, and a start of an object seen before finds its slot in
 *   a line no other CPU wrote.
 * - a slot is taken while the count of lives started that its start wrote
 *   into it (`life`, from the lives map, which only starts read or write)
 *   differs from the count of lives ended (`ended`, written by whatever
 *   ends a life).  A start reads nothing a completion wrote: a life it
 *   replaces that never ended (the kernel ran no completion program for
 *   it) is counted where the next life ends.
 * - keys of one life (a bio's, | 1; a block_getrq start's bio, | 2; the
 *   perf-event path's fingerprints, odd) are cleared when the life ends.
 * A kept key's slot whose last life ended is as good as free to another
 * key (claim_taken): the kernel may cycle through more request objects
 * than the table has slots.
 */
struct slot_ref {
	struct iotrace_slot *s;
	u64 *tag;
	u32 *lives;
	u32 idx;
};

/* (dev, sector) on the tracepoint path; (0, address) on the raw one */
static __always_inline u64 key_hash(u32 dev, u64 sector)
{
	u64 x = (sector * IOTRACE_HASH_MUL) ^ dev;

	x ^= x >> 29;
	x *= IOTRACE_HASH_MUL;
	return x ^ (x >> 32);
}

/* First slot of the home group of a key's hash. */
static __always_inline u32 group_of(u64 h)
{
	return (u32)(h >> 32) & (IOTRACE_INFLIGHT_SLOTS - 1) & ~(IOTRACE_INFLIGHT_PROBES - 1);
}

/* First slot of the second group: other bits of the hash, never the home group (unless only one) */
static __always_inline u32 second_group_of(u64 h)
{
	u32 g = (u32)h & (IOTRACE_INFLIGHT_SLOTS - 1) & ~(IOTRACE_INFLIGHT_PROBES - 1);

	if (g == group_of(h))
		g = (g + IOTRACE_INFLIGHT_PROBES) & (IOTRACE_INFLIGHT_SLOTS - 1);
	return g;
}

static __always_inline u32 *spill_count(u32 home)
{
	u32 g = home / IOTRACE_INFLIGHT_PROBES;

	return spills.lookup(&g);
}

/* A key its slot keeps between lives: a request's address (its low bits clear: requests are cache-line aligned). */
static __always_inline bool key_kept(u64 tag)
{
	return (tag & 3) == 0;
}

/* The tags of the group whose first slot is `base`, or 0. */
static __always_inline u64 *group_tags(u32 base)
{
	u32 g = base / IOTRACE_INFLIGHT_PROBES;
	struct iotrace_tags *t = tags.lookup(&g);

	return t ? t->tag : 0;
}

/* Slot `i` of the group at `base`, whose tags are `t`. */
static __always_inline bool ref_at(u64 *t, u32 base, u32 i, struct slot_ref *r)
{
	u32 idx = base + i;

	r->tag = &t[i];
	r->s = inflight.lookup(&idx);
	r->lives = lives.lookup(&idx);
	r->idx = idx;
	return r->s && r->lives;
}

/* Whether the slot holds a life not ended. */
static __always_inline bool slot_taken(const struct slot_ref *r)
{
	return r->s->life != r->s->ended;
}

static __always_inline u64 slot_hash(const struct slot_ref *r);
/* The tag of a slot whose key's copy is filled in (per path, beside slot_hash()). */
static __always_inline u64 slot_tag(const struct slot_ref *r);

/* While its tag is ours: a slot outside its key's home group is a spill of that group. */
static __always_inline void unspill(struct slot_ref *r)
{
	u32 home = group_of(slot_hash(r)), *sp;

	if ((r->idx & ~(IOTRACE_INFLIGHT_PROBES - 1)) == home)
		return;
	sp = spill_count(home);
	if (sp)
		__sync_fetch_and_add(sp, -1);	/* BPF has no atomic sub */
}

/*
 * The slot's count of lives, one more, as read after the add: a line only
 * starts write, so no wait for another CPU.  (An add whose old value is not
 * used, then a read: any kernel's verifier takes it.)
 */
static __always_inline u32 life_next(struct slot_ref *r)
{
	__sync_fetch_and_add(r->lives, 1);
	return *(volatile u32 *)r->lives;
}

/*
 * A new life of `key`, which the slot holds: nothing read that a
 * completion wrote.  A key starts on one CPU at a time (a request object
 * starts again once its last life is over), but another key may be taking
 * its slot over right now (claim_taken): the count goes up first, with a
 * full barrier, then the tag is read again, and claim_taken reads the
 * count again after its swap, so at least one of the two sees the other.
 * False: the slot is another's; this life is not recorded (its completion
 * counts it).
 */
static __always_inline bool slot_restart(struct slot_ref *r, u64 key, u64 now)
{
	u32 n = life_next(r);

	if (*(volatile u64 *)r->tag != key)
		return false;
	r->s->start_ns = now;
	r->s->issue_ns = 0;
	r->s->life = n;
	return true;
}

/* The first life of a key in a slot just claimed: lives not ended before it are no longer its to count. */
static __always_inline void slot_begin(struct slot_ref *r, u64 now)
{
	u32 n = life_next(r);

	r->s->start_ns = now;
	r->s->issue_ns = 0;
	r->s->ended = n - 1;
	/* times first: a slot that looks taken has its new start (claim_taken) */
	asm volatile("" ::: "memory");
	r->s->life = n;
}

/*
 * The slot's life ends: the lives before it that never ended are counted
 * lost, and a key of one life leaves the slot.
 */
static __always_inline void slot_release(struct slot_ref *r)
{
	u32 unseen = r->s->life - r->s->ended - 1;

	if (unseen && unseen < IOTRACE_INFLIGHT_SLOTS)
		count_reasons(IOTRACE_DROP_LOST_COMPLETION, unseen);
	r->s->ended = r->s->life;
	if (key_kept(slot_tag(r)))
		return;
	unspill(r);
	tag_clear(r->tag, slot_tag(r));
}

/* Claim a free slot of the group starting at `base` for `tag`. */
static __always_inline bool claim_free(u32 base, u64 tag, struct slot_ref *r)
{
	u64 *t = group_tags(base);

	if (!t)
		return false;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		/* two CPUs may race for the same slot: one wins */
		if (t[i] == 0 && ref_at(t, base, i, r) && tag_cas(r->tag, 0, tag))
			return true;
	}
	return false;
}

/*
 * Take over a slot of the group at `base` from its key: a kept key whose
 * last life ended, or a life older than IOTRACE_STALE_NS (its completion
 * was skipped by the kernel, and user space has counted it lost, or it
 * will never come).  A kept key's slot whose key copy is not its tag is
 * being claimed right now: left alone.  A start of the old key racing the
 * take-over shows in the lives count, read again once the tag is ours
 * (slot_restart): then the slot goes back to it.  (That start's count
 * stays, so the key's next life counts one lost completion too many:
 * counted, never hidden.)
 */
static __always_inline bool claim_taken(u32 base, u64 tag, u64 now, struct slot_ref *r)
{
	u64 *t = group_tags(base);

	if (!t)
		return false;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		u64 old = t[i], start;
		u32 seen;
		bool taken;

		if (!old || !ref_at(t, base, i, r))
			continue;
		seen = *r->lives;
		taken = slot_taken(r);
		start = r->s->start_ns;
		/* a start_ns after `now` is a slot another CPU is filling in right now: not stale */
		if (taken && (start >= now || now - start <= IOTRACE_STALE_NS))
			continue;
		if (!taken && (!key_kept(old) || slot_tag(r) != old))
			continue;
		if (!tag_cas(r->tag, old, tag))
			continue;
		if (!taken && *(volatile u32 *)r->lives != seen) {
			tag_cas(r->tag, tag, old);	/* its key started again meanwhile: it keeps the slot */
			continue;
		}
		unspill(r);	/* the old key is still in the slot */
		count_reason(taken ? IOTRACE_NOTE_RECLAIMED : IOTRACE_NOTE_REBOUND);
		return true;
	}
	return false;
}

/* Claim a slot of the second group, counting the spill first: a lookup that finds it looks there. */
static __always_inline bool claim_spill(u32 home, u32 other, u64 tag, u64 now, bool taken,
					struct slot_ref *r)
{
	u32 *sp = spill_count(home);

	if (other == home || !sp)
		return false;
	__sync_fetch_and_add(sp, 1);
	if (taken ? claim_taken(other, tag, now, r) : claim_free(other, tag, r))
		return true;
	__sync_fetch_and_add(sp, -1);	/* BPF has no atomic sub */
	return false;
}

/*
 * Take a free slot for `tag` in the home group of hash `h`, else in its
 * second group, else one taken over in either.  Returns false when none is
 * left.  The caller fills in the key's fields, its copy of the key last.
 */
static __always_inline bool slot_claim(u64 h, u64 tag, u64 now, struct slot_ref *r)
{
	u32 home = group_of(h), other = second_group_of(h);

	if (!claim_free(home, tag, r) && !claim_spill(home, other, tag, now, false, r) &&
	    !claim_taken(home, tag, now, r) && !claim_spill(home, other, tag, now, true, r))
		return false;
	slot_begin(r, now);
	return true;
}

/* ---- histograms --------------------------------------------------------- */

static __always_inline u32 log2_u64(u64 v)
{
	u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	return r | (v >> 1);
}

/* The bucket scheme of contract.toml, which is HdrHistogram's counts index. */
static __always_inline u16 bucket_of(u64 ns)
{
	const u64 top = (1ULL << (IOTRACE_HIST_MAX_MSB + 1)) - 1;
	u32 msb;

	if (ns < (1ULL << IOTRACE_HIST_SUB_BITS))
		return ns;
	if (ns > top) {
		count_reason(IOTRACE_DROP_CLAMPED);
		ns = top;
	}
	msb = log2_u64(ns);
	return ((msb - IOTRACE_HIST_SUB_BITS + 1) << IOTRACE_HIST_SUB_BITS) |
	       ((ns >> (msb - IOTRACE_HIST_SUB_BITS)) & ((1U << IOTRACE_HIST_SUB_BITS) - 1));
}

/*
 * A histogram's buckets take cells in runs of IOTRACE_HIST_CELL_RUN, one
 * cache line of cells: a run is placed by a hash of (pid, dev, op, phase,
 * bucket / run), and a bucket sits at its offset in the run.  A series'
 * latencies cluster in a few neighbouring buckets, so its updates keep
 * hitting the same lines, while the runs of different series and phases
 * spread over the whole table.  (Measured: a hash of the whole key
 * scattered neighbours and cost ~140 ns more per completion; one base per
 * series and phase with all its buckets side by side let the three
 * phases' ranges, ~3000 cells each, overlap in most runs, and up to 20% of
 * the samples of a single fio job then spilled into the hash map.)
 */
static __always_inline u32 cell_run(const struct iotrace_hist_key *k)
{
	u64 series = ((u64)k->pid << 32) | k->dev;
	u64 where = ((u64)k->op << 8 | k->phase) << 16 | (k->bucket / IOTRACE_HIST_CELL_RUN);
	u64 x = (series ^ (where * IOTRACE_HASH_MUL)) * IOTRACE_HASH_MUL;

	return (u32)(x >> 32);
}

/* The 12-byte keys compared as a u64 and a u32: (pid, dev), then (bucket, op, phase). */
static __always_inline bool same_key(const struct iotrace_hist_key *a, const struct iotrace_hist_key *b)
{
	return *(const u64 *)a == *(const u64 *)b && *((const u32 *)a + 2) == *((const u32 *)b + 2);
}

/* Count one sample in its cell; false if no cell could take it. */
static __always_inline bool cell_add(u32 gen, u32 cpu, const struct iotrace_hist_key *k)
{
	u32 run = cell_run(k), off = k->bucket % IOTRACE_HIST_CELL_RUN;

	if (cpu >= IOTRACE_CPUS)
		return false;
	/* the probe window: the same offset in the next runs of this CPU's part */
#pragma unroll
	for (u32 i = 0; i < IOTRACE_HIST_CELL_PROBES; i++) {
		u32 idx = (gen * IOTRACE_CPUS + cpu) * IOTRACE_HIST_CELLS +
			  (((run + i) * IOTRACE_HIST_CELL_RUN + off) & (IOTRACE_HIST_CELLS - 1));
		struct iotrace_hist_cell *c = cells.lookup(&idx);

		if (!c)
			return false;
		if (c->count == 0) {
			c->key = *k;
			c->count = 1;
			return true;
		}
		/* a saturated cell spills into the hash map; user space adds both */
		if (same_key(&c->key, k) && c->count != 0xFFFFFFFF) {
			c->count++;
			return true;
		}
	}
	return false;
}

/* lookup_or_init's view of the histogram pair hist0/hist1 */
static __always_inline void *hist_lookup(u32 gen, const void *k)
{
	return gen ? hist1.lookup((struct iotrace_hist_key *)k) : hist0.lookup((struct iotrace_hist_key *)k);
}
static __always_inline int hist_insert(u32 gen, const void *k, const void *v)
{
	return gen ? hist1.insert((struct iotrace_hist_key *)k, (u64 *)v) :
		     hist0.insert((struct iotrace_hist_key *)k, (u64 *)v);
}

static __always_inline void hist_add(u32 gen, u32 cpu, struct iotrace_hist_key *k)
{
	u64 zero = 0, *n;

	if (cell_add(gen, cpu, k))
		return;
	count_reason(IOTRACE_NOTE_HIST_OVERFLOW);
	n = lookup_or_init(hist_lookup, hist_insert, gen, k, 0, &zero, IOTRACE_DROP_HIST_FULL);
	/* per-CPU value, and programs do not nest on a CPU */
	if (n)
		(*n)++;
}

/* The 12-byte series keys compared as a u64 and a u32: (pid, dev), then op. */
static __always_inline bool same_series(const struct iotrace_series_key *a, const struct iotrace_series_key *b)
{
	return *(const u64 *)a == *(const u64 *)b && a->op == b->op;
}

/*
 * The value of series `k` in this CPU's cells (claimed if new: the caller
 * counts a request in it at once), else 0.  No atomics: the cells are this
 * CPU's, and the completion programs do not nest on it (record_once).
 */
static __always_inline struct iotrace_series_val *series_cell(u32 gen, u32 cpu, const struct iotrace_series_key *k)
{
	u64 x = ((((u64)k->pid << 32) | k->dev) ^ ((u64)k->op * IOTRACE_HASH_MUL)) * IOTRACE_HASH_MUL;
	u32 h = x >> 32;

	if (cpu >= IOTRACE_CPUS)
		return 0;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_SERIES_CELL_PROBES; i++) {
		u32 idx = (gen * IOTRACE_CPUS + cpu) * IOTRACE_SERIES_CELLS + ((h + i) & (IOTRACE_SERIES_CELLS - 1));
		struct iotrace_series_cell *c = series_cells.lookup(&idx);

		if (!c)
			return 0;
		if (c->val.count == 0) {
			c->key = *k;
			return &c->val;
		}
		if (same_series(&c->key, k))
			return &c->val;
	}
	return 0;
}

/* lookup_or_init's view of the series pair series0/series1 */
static __always_inline void *series_lookup(u32 gen, const void *k)
{
	return gen ? series1.lookup((struct iotrace_series_key *)k) : series0.lookup((struct iotrace_series_key *)k);
}
static __always_inline int series_insert(u32 gen, const void *k, const void *v)
{
	return gen ? series1.insert((struct iotrace_series_key *)k, (struct iotrace_series_val *)v) :
		     series0.insert((struct iotrace_series_key *)k, (struct iotrace_series_val *)v);
}

/* The value of series `k` in the overflow hash, made if new; 0 (counted) when the hash is full. */
static __always_inline struct iotrace_series_val *series_hashed(u32 gen, struct iotrace_series_key *k)
{
	struct iotrace_series_val zero = {};

	return lookup_or_init(series_lookup, series_insert, gen, k, 0, &zero, IOTRACE_DROP_SERIES_FULL);
}

static __always_inline struct iotrace_series_val *series_get(u32 gen, u32 cpu, struct iotrace_series_key *k)
{
	struct iotrace_series_val *v = series_cell(gen, cpu, k);

	return v ? v : series_hashed(gen, k);
}

static __always_inline void phase_add(u32 gen, u32 cpu, struct iotrace_series_val *v,
				      struct iotrace_hist_key *hk, u32 phase, u64 ns)
{
	if (phase >= IOTRACE_PHASE_COUNT)
		return;
	v->sum_ns[phase] += ns;
	v->phase_count[phase]++;
	if (v->min_ns[phase] == 0 || ns < v->min_ns[phase])
		v->min_ns[phase] = ns ? ns : 1;
	if (ns > v->max_ns[phase])
		v->max_ns[phase] = ns;
	hk->phase = phase;
	hk->bucket = bucket_of(ns);
	hist_add(gen, cpu, hk);
}

/* b - a, or 0 (counted) when two CPUs' clocks put b before a */
static __always_inline u64 elapsed(u64 a, u64 b)
{
	if (b >= a)
		return b - a;
	count_reason(IOTRACE_NOTE_CLOCK_SKEW);
	return 0;
}

/* Account a finished request; the caller releases the slot. */
static __always_inline void record(struct iotrace_slot *s, u64 now)
{
	struct iotrace_config *cfg = get_config();
	struct iotrace_series_key sk = {};
	struct iotrace_hist_key hk = {};
	struct iotrace_series_val *v;
	u32 gen, cpu = bpf_get_smp_processor_id();

	if (!cfg)
		return;
	gen = cfg->gen;
	sk.pid = cfg->per_thread ? s->tid : s->tgid;
	sk.dev = s->dev;
	sk.op = s->op;
	v = series_get(gen, cpu, &sk);
	if (!v)
		return;	/* counted */
	/* the latest name wins: a process's first I/O may predate its exec */
	__builtin_memcpy(v->comm, s->comm, sizeof(v->comm));
	v->count++;
	v->bytes += s->done;
	v->cgroup = s->cgroup;
	v->tgid = s->tgid;
	v->last_ns = now;

	hk.pid = sk.pid;
	hk.dev = sk.dev;
	hk.op = sk.op;
	/* a request the flush machinery finished was never issued itself */
	if (s->issue_ns) {
		phase_add(gen, cpu, v, &hk, IOTRACE_PHASE_QUEUE, elapsed(s->start_ns, s->issue_ns));
		phase_add(gen, cpu, v, &hk, IOTRACE_PHASE_DEVICE, elapsed(s->issue_ns, now));
	}
	phase_add(gen, cpu, v, &hk, IOTRACE_PHASE_TOTAL, elapsed(s->start_ns, now));
}

/* ---- request start, shared by both paths -------------------------------- */

/*
 * The dirtier whose inode the current thread (`tid`) is writing back, or 0:
 * one array read while none is.  Without write-back attribution
 * (IOTRACE_NO_WRITEBACK: the cost bench's "off", scripts/bench_cost.py) the
 * request path does not look at all.
 */
static __always_inline struct iotrace_dirtier *wb_writing(u32 tid)
{
#ifdef IOTRACE_NO_WRITEBACK
	return 0;
#endif
	u32 zero = 0, *busy = wb_busy.lookup(&zero);

	if (!busy || !*busy)
		return 0;
	return wb_threads.lookup(&tid);
}

/* The two epochs of `who_epochs` now */
static __always_inline void who_epochs_now(u32 *programs, u32 *user)
{
	u32 k = IOTRACE_WHO_EPOCH_PROGRAMS, *e = who_epochs.lookup(&k);

	*programs = e ? *e : 0;
	k = IOTRACE_WHO_EPOCH_USER;
	e = who_epochs.lookup(&k);
	*user = e ? *e : 0;
}

/* Something changed who a thread is (an exec) or whom the pid filter holds: every `who` entry is read again. */
static __always_inline void who_changed(void)
{
	u32 k = IOTRACE_WHO_EPOCH_PROGRAMS, *e = who_epochs.lookup(&k);

	if (e)
		__sync_fetch_and_add(e, 1);
}

/* This CPU's `who` entry for thread `tid`, whoever it holds; 0 if none. */
static __always_inline struct iotrace_who *who_slot(u32 tid)
{
	u32 cpu = bpf_get_smp_processor_id(), idx = cpu * IOTRACE_WHO_SLOTS + tid % IOTRACE_WHO_SLOTS;

	return cpu < IOTRACE_CPUS ? who.lookup(&idx) : 0;
}

/*
 * Whether the pid filter holds process `tgid`, the current one: as the
 * current thread's `who` entry says while no epoch has moved since it was
 * read (the epochs are read first: a change made after them moves one),
 * else from the hash.
 */
static __always_inline bool pid_traced(u32 tgid)
{
	u32 tid = (u32)bpf_get_current_pid_tgid(), programs, user;
	struct iotrace_who *w = who_slot(tid);

	who_epochs_now(&programs, &user);
	if (w && w->tid == tid && w->in_pids != IOTRACE_WHO_PIDS_NOT_READ && w->epoch == programs &&
	    w->user_epoch == user)
		return w->in_pids == IOTRACE_WHO_PIDS_IN;
	return pids.lookup(&tgid);
}

/*
 * Whether the current task's I/O is traced (process tgid).  Programs
 * attach before the filters are written, and wait for them.
 */
static __always_inline bool task_wanted(u32 tgid)
{
	struct iotrace_config *cfg = get_config();

	if (!cfg || !cfg->enabled)
		return false;
	/* left out, unless it is a flusher writing back a traced dirtier's inode: that one passed when it wrote */
	if (cfg->filter_pids && !pid_traced(tgid))
		return wb_writing((u32)bpf_get_current_pid_tgid());
	/* in the cgroup or below it: then its ancestor at the cgroup's depth is the cgroup */
	if (cfg->filter_cgroup && !in_filter_cgroup(cfg))
		return wb_writing((u32)bpf_get_current_pid_tgid());
	return true;
}

/* Whether I/O on `dev` is traced. */
static __always_inline bool dev_wanted(u32 dev)
{
	struct iotrace_config *cfg = get_config();

	return cfg && (!cfg->filter_devs || devs.lookup(&dev));
}

/*
 * The current thread's comm and cgroup, and whether the pid filter holds
 * its process, from this CPU's cache (struct iotrace_who).
 */
static __always_inline struct iotrace_who *who_is(u64 id, u64 now)
{
	struct iotrace_who *w = who_slot((u32)id);
	u32 programs, user, tgid = id >> 32;
	struct iotrace_config *cfg;

	if (!w)
		return 0;
	who_epochs_now(&programs, &user);
	/* signed: a kernel-stamped request start's time lags a bio start's clock (raw_tp.bpf.c start_clock) */
	if (w->tid != (u32)id || w->epoch != programs || w->user_epoch != user ||
	    (s64)(now - w->ns) > (s64)IOTRACE_COMM_REUSE_NS) {
		w->cgroup = bpf_get_current_cgroup_id();
		bpf_get_current_comm(w->comm, sizeof(w->comm));
		w->tid = (u32)id;
		w->epoch = programs;
		w->user_epoch = user;
		w->ns = now;
		cfg = get_config();
		/* read after the epochs: a change made since moves one of them, and this is read again */
		w->in_pids = !cfg || !cfg->filter_pids ? IOTRACE_WHO_PIDS_NOT_READ :
			     pids.lookup(&tgid) ? IOTRACE_WHO_PIDS_IN : IOTRACE_WHO_PIDS_OUT;
	}
	return w;
}

/* ---- write-back: the request side (the events' side is writeback.bpf.h) --- */

/* A request started by a flusher thread writing back a traced dirtier's inode is the dirtier's. */
static __always_inline void wb_charge(struct iotrace_slot *s, u32 tid)
{
	struct iotrace_dirtier *d = wb_writing(tid);

	if (!d)
		return;
	s->tgid = d->tgid;
	s->tid = d->tid;
	s->cgroup = d->cgroup;
	__builtin_memcpy(s->comm, d->comm, sizeof(s->comm));
	/* and the window its data was dirtied in: its bytes are credited there (iotrace.h) */
	s->op |= IOTRACE_OP_WB | (d->window << IOTRACE_OP_WINDOW_SHIFT);
}

/* Note who started the request (pid_tgid `id`) in its freshly claimed slot. */
static __always_inline void slot_fill(struct iotrace_slot *s, u64 now, u64 id, u32 dev, u32 op, u32 bytes)
{
	struct iotrace_who *w = who_is(id, now);

	s->dev = dev;
	s->op = op;
	s->tgid = id >> 32;
	s->tid = (u32)id;
	if (w) {
		s->cgroup = w->cgroup;
		__builtin_memcpy(s->comm, w->comm, sizeof(s->comm));
	} else {
		s->cgroup = bpf_get_current_cgroup_id();
		bpf_get_current_comm(s->comm, sizeof(s->comm));
	}
	s->remaining = bytes;
	s->done = 0;
	wb_charge(s, (u32)id);
}

/* A request moving to another slot (`to`, freshly claimed): all but the key's copy (sector) and its lives. */
static __always_inline void slot_copy(struct iotrace_slot *to, const struct iotrace_slot *from)
{
	u64 key = to->sector;
	u32 life = to->life, ended = to->ended;

	__builtin_memcpy(to, from, sizeof(*to));
	to->sector = key;
	to->life = life;
	to->ended = ended;
}

/* Follow forks of traced processes (the filter's children). */
static __always_inline void on_fork(u32 child)
{
	struct iotrace_config *cfg = get_config();
	/* the forking thread's process, not its thread id */
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	u8 one = 1;

	if (!cfg || !cfg->filter_pids || !cfg->follow_children)
		return;
	if (!pid_traced(parent))
		return;
	if (pids.update(&child, &one))
		count_reason(IOTRACE_DROP_PID_FULL);
	else
		who_changed();	/* a thread of that id may have left an entry saying "out" */
}

/*
 * An exec renames its thread: every comm cached before it is read again
 * (the thread's entries may sit on any CPU; execs are rare).  Without this
 * a shell's child that did I/O just before exec'ing dd kept the shell's name.
 */
static __always_inline void on_exec(void)
{
	who_changed();
}

/* Keeps the filter bounded, and a reused pid from being traced. */
static __always_inline void on_exit(bool group_dead)
{
	struct iotrace_config *cfg = get_config();
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, tgid = id >> 32;

	if (!cfg || !cfg->filter_pids || !cfg->follow_children)
		return;
	/* a thread's own entry (from its clone) goes; the process's only with its last thread */
	if (tid != tgid && pids.delete(&tid) == 0)
		who_changed();
	/* the id may be a new process's soon: an entry saying "in" must not outlive it */
	if (group_dead && pids.delete(&tgid) == 0)
		who_changed();
}

#endif /* IOTRACE_CORE_BPF_H */
