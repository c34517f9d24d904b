// SPDX-License-Identifier: GPL-2.0
/*
 * iotrace.bpf.c - per-process, per-device block I/O latency histograms.
 *
 * Portability rule: these programs read nothing but tracepoint fields
 * (args->...) and BPF helpers.  No kprobes, no kernel struct layouts: every
 * field offset comes from the running kernel's tracepoint format, so the
 * program means the same whichever kernel header tree bcc compiles it
 * against.  Keep it that way.
 *
 * A request's life:
 *   block_io_start    submitter's context: claim an in-flight slot, note
 *                     tgid, tid, comm, cgroup and the op
 *   block_rq_issue    handed to the driver: note the time and final size
 *   block_rq_complete account queue / device / total latency into the
 *                     per-CPU histograms of the current generation, and
 *                     free the slot
 *
 * The kernel runs one tracepoint BPF program per CPU at a time and skips
 * (and counts, in the program's recursion_misses) an event that fires while
 * any is running there, e.g. a completion softirq interrupting our
 * block_io_start.  tracer/probe.py reports those skipped completions as
 * dropped; their slots are reused once stale (IOTRACE_STALE_NS).  Every
 * program here is kept short partly for that reason: the shorter they run,
 * the fewer events land on top of them.
 * User space flips the generation, waits out programs still running on
 * the old one, then drains it: intervals are exact and nothing races a
 * delete.  Keys, values and codes live in iotrace.h.
 *
 * IOTRACE_START_CATEGORY / IOTRACE_START_EVENT name the start tracepoint
 * (block_io_start, or block_rq_insert on kernels before 6.5); tracer/probe.py
 * substitutes them before compiling.
 */
#include "iotrace.h"

/* [0] -> struct iotrace_config, written by user space */
BPF_ARRAY(config, struct iotrace_config, 1);
/* slot index -> struct iotrace_slot: requests between start and completion */
BPF_ARRAY(inflight, struct iotrace_slot, IOTRACE_INFLIGHT_SLOTS);
/* cell index -> struct iotrace_hist_cell, per CPU, generation 0 / 1: the fast path */
BPF_PERCPU_ARRAY(cells0, struct iotrace_hist_cell, IOTRACE_HIST_CELLS);
BPF_PERCPU_ARRAY(cells1, struct iotrace_hist_cell, IOTRACE_HIST_CELLS);
/* struct iotrace_hist_key -> u64 count, per CPU, generation 0 / 1: keys with no cell */
BPF_PERCPU_HASH(hist0, struct iotrace_hist_key, u64, IOTRACE_HIST_ENTRIES);
BPF_PERCPU_HASH(hist1, struct iotrace_hist_key, u64, IOTRACE_HIST_ENTRIES);
/* struct iotrace_series_key -> struct iotrace_series_val, per CPU, generation 0 / 1 */
BPF_PERCPU_HASH(series0, struct iotrace_series_key, struct iotrace_series_val, IOTRACE_SERIES_ENTRIES);
BPF_PERCPU_HASH(series1, struct iotrace_series_key, struct iotrace_series_val, IOTRACE_SERIES_ENTRIES);
/* enum iotrace_reason -> u64 events, per CPU, never reset */
BPF_PERCPU_ARRAY(reasons, u64, IOTRACE_REASON_COUNT);
/* tgid (or forked tid) -> 1: the processes traced when filter_pids is set */
BPF_HASH(pids, u32, u8, IOTRACE_PID_ENTRIES);
/* dev_t -> 1: the devices traced when filter_devs is set */
BPF_HASH(devs, u32, u8, IOTRACE_DEV_ENTRIES);

static __always_inline void count_reason(u32 reason)
{
	u64 *n = reasons.lookup(&reason);

	/* another program may interrupt this one on the same CPU */
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline struct iotrace_config *get_config(void)
{
	u32 zero = 0;

	return config.lookup(&zero);
}

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

/* ---- the in-flight table ------------------------------------------------ */

static __always_inline u32 slot_hash(u32 dev, u64 sector)
{
	return ((sector ^ ((u64)dev << 40)) * IOTRACE_HASH_MUL) >> 32;
}

/*
 * A free slot near hash(dev, sector), owned by the caller, or NULL.  A busy
 * slot older than IOTRACE_STALE_NS is taken too: its completion was skipped
 * by the kernel (and counted as such), or will never be matched.
 */
static __always_inline struct iotrace_slot *slot_claim(u32 dev, u64 sector, u64 now)
{
	u32 h = slot_hash(dev, sector);

#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		u32 idx = (h + i) & (IOTRACE_INFLIGHT_SLOTS - 1);
		struct iotrace_slot *s = inflight.lookup(&idx);
		bool stale;
		u64 state;

		if (!s)
			return NULL;
		state = s->state;
		stale = state == IOTRACE_SLOT_BUSY && now - s->start_ns > IOTRACE_STALE_NS;
		if (state == IOTRACE_SLOT_BUSY && !stale)
			continue;
		/* two CPUs may race for the same slot: one wins */
		if (__sync_val_compare_and_swap(&s->state, state, IOTRACE_SLOT_BUSY) == state) {
			if (stale)
				count_reason(IOTRACE_NOTE_RECLAIMED);
			s->dev = dev;
			s->sector = sector;
			return s;
		}
	}
	return NULL;
}

/*
 * The slot of the request at (dev, sector).  Empty flushes all sit at
 * sector 0 with no data; zero-byte completions only match slots with
 * nothing left to complete, so a flush never steals a data request's slot
 * and vice versa.
 */
static __always_inline struct iotrace_slot *slot_find(u32 dev, u64 sector, bool zero_bytes)
{
	u32 h = slot_hash(dev, sector);

#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		u32 idx = (h + i) & (IOTRACE_INFLIGHT_SLOTS - 1);
		struct iotrace_slot *s = inflight.lookup(&idx);

		if (!s)
			return NULL;
		if (s->state == IOTRACE_SLOT_BUSY && s->dev == dev && s->sector == sector &&
		    (s->remaining == 0) == zero_bytes)
			return s;
	}
	return NULL;
}

static __always_inline void slot_release(struct iotrace_slot *s)
{
	/* a full barrier: the fields are dead once the state says so */
	__sync_lock_test_and_set(&s->state, IOTRACE_SLOT_FREE);
}

/*
 * Re-key a request whose start sector moved (front merge, partial
 * completion).  Returns 0 on success; on failure the request is lost and
 * counted, since its next event could not be matched anyway.
 */
static __always_inline int slot_move(struct iotrace_slot *s, u64 sector)
{
	struct iotrace_slot *to = slot_claim(s->dev, sector, s->start_ns);

	if (!to) {
		slot_release(s);
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return -1;
	}
	to->op = s->op;
	to->start_ns = s->start_ns;
	to->issue_ns = s->issue_ns;
	to->cgroup = s->cgroup;
	to->tgid = s->tgid;
	to->tid = s->tid;
	to->remaining = s->remaining;
	to->done = s->done;
	__builtin_memcpy(to->comm, s->comm, sizeof(to->comm));
	slot_release(s);
	return 0;
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

/* The bucket scheme of iotrace.h, which is HdrHistogram's counts index. */
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

static __always_inline u32 cell_hash(const struct iotrace_hist_key *k)
{
	u64 a = ((u64)k->pid << 32) | k->dev;
	u64 b = ((u64)k->bucket << 16) | ((u64)k->op << 8) | k->phase;

	u64 x = a ^ (b * IOTRACE_HASH_MUL);

	/* fold the high half down so every key bit reaches the index bits */
	return ((x ^ (x >> 32)) * IOTRACE_HASH_MUL) >> 32;
}

static __always_inline bool same_key(const struct iotrace_hist_key *a, const struct iotrace_hist_key *b)
{
	return a->pid == b->pid && a->dev == b->dev && a->bucket == b->bucket &&
	       a->op == b->op && a->phase == b->phase;
}

/* Count one sample in its cell; false if no cell could take it. */
static __always_inline bool cell_add(u32 gen, const struct iotrace_hist_key *k)
{
	u32 h = cell_hash(k);

#pragma unroll
	for (u32 i = 0; i < IOTRACE_HIST_CELL_PROBES; i++) {
		u32 idx = (h + i) & (IOTRACE_HIST_CELLS - 1);
		struct iotrace_hist_cell *c = gen ? cells1.lookup(&idx) : cells0.lookup(&idx);

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

static __always_inline void hist_add(u32 gen, struct iotrace_hist_key *k)
{
	u64 one = 1, *n;

	if (cell_add(gen, k))
		return;
	count_reason(IOTRACE_NOTE_HIST_OVERFLOW);
	n = gen ? hist1.lookup(k) : hist0.lookup(k);
	if (n) {
		/* per-CPU value, and programs do not nest on a CPU */
		(*n)++;
		return;
	}
	if ((gen ? hist1.insert(k, &one) : hist0.insert(k, &one)) == 0)
		return;
	/* lost the race to create it, or the map is full */
	n = gen ? hist1.lookup(k) : hist0.lookup(k);
	if (n)
		(*n)++;
	else
		count_reason(IOTRACE_DROP_HIST_FULL);
}

static __always_inline struct iotrace_series_val *series_get(u32 gen, struct iotrace_series_key *k)
{
	struct iotrace_series_val zero = {}, *v;

	v = gen ? series1.lookup(k) : series0.lookup(k);
	if (v)
		return v;
	if (gen)
		series1.insert(k, &zero);
	else
		series0.insert(k, &zero);
	return gen ? series1.lookup(k) : series0.lookup(k);
}

static __always_inline void phase_add(u32 gen, struct iotrace_series_val *v,
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
	hist_add(gen, hk);
}

/* Account a finished request; the caller releases the slot. */
static __always_inline void record(struct iotrace_slot *s, u64 now)
{
	struct iotrace_config *cfg = get_config();
	struct iotrace_series_key sk = {};
	struct iotrace_hist_key hk = {};
	struct iotrace_series_val *v;
	u32 gen;

	if (!cfg)
		return;
	gen = cfg->gen;
	sk.pid = cfg->per_thread ? s->tid : s->tgid;
	sk.dev = s->dev;
	sk.op = s->op;
	v = series_get(gen, &sk);
	if (!v) {
		count_reason(IOTRACE_DROP_SERIES_FULL);
		return;
	}
	/* the latest name wins: a process's first I/O may predate its exec */
	__builtin_memcpy(v->comm, s->comm, sizeof(v->comm));
	v->count++;
	v->bytes += s->done;
	v->cgroup = s->cgroup;
	v->tgid = s->tgid;

	hk.pid = sk.pid;
	hk.dev = sk.dev;
	hk.op = sk.op;
	/* a request the flush machinery finished was never issued itself */
	if (s->issue_ns) {
		phase_add(gen, v, &hk, IOTRACE_PHASE_QUEUE, s->issue_ns - s->start_ns);
		phase_add(gen, v, &hk, IOTRACE_PHASE_DEVICE, now - s->issue_ns);
	}
	phase_add(gen, v, &hk, IOTRACE_PHASE_TOTAL, now - s->start_ns);
}

/* ---- tracepoints -------------------------------------------------------- */

TRACEPOINT_PROBE(IOTRACE_START_CATEGORY, IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = bpf_ktime_get_ns();
	struct iotrace_config *cfg = get_config();
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, dev = args->dev;
	struct iotrace_slot *s;

	/* programs attach before the filters are written: wait for them */
	if (!cfg || !cfg->enabled)
		return 0;
	if (cfg->filter_pids && !pids.lookup(&tgid))
		return 0;
	if (cfg->filter_devs && !devs.lookup(&dev))
		return 0;
	s = slot_claim(dev, args->sector, now);
	if (!s) {
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return 0;
	}
	s->op = rwbs_op(args->rwbs, args->bytes);
	s->start_ns = now;
	s->issue_ns = 0;
	s->cgroup = bpf_get_current_cgroup_id();
	s->tgid = tgid;
	s->tid = (u32)id;
	s->remaining = args->bytes;
	s->done = 0;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	return 0;
}

/* Like slot_find, but a request not issued yet wins over one being re-issued. */
static __always_inline struct iotrace_slot *slot_find_issue(u32 dev, u64 sector, bool zero_bytes)
{
	struct iotrace_slot *issued = NULL;
	u32 h = slot_hash(dev, sector);

#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		u32 idx = (h + i) & (IOTRACE_INFLIGHT_SLOTS - 1);
		struct iotrace_slot *s = inflight.lookup(&idx);

		if (!s)
			return issued;
		if (s->state != IOTRACE_SLOT_BUSY || s->dev != dev || s->sector != sector ||
		    (s->remaining == 0) != zero_bytes)
			continue;
		if (s->issue_ns == 0)
			return s;
		if (!issued)
			issued = s;
	}
	return issued;
}

/* REQ_OP_FLUSH ("FF"): the kernel's own flush on behalf of queued flushes */
static __always_inline bool internal_flush(const char *rwbs)
{
	return rwbs[0] == 'F' && rwbs[1] == 'F';
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
	u64 now = bpf_ktime_get_ns();
	struct iotrace_slot *s;

	/* it sits at sector 0 with no data, like the flushes it serves: never match it */
	if (internal_flush(args->rwbs)) {
		count_reason(IOTRACE_NOTE_INTERNAL_FLUSH);
		return 0;
	}
	/* two requests may be in flight at one sector: the unissued one is issued */
	s = slot_find_issue(args->dev, args->sector, args->bytes == 0);
	if (!s)
		return 0;
	s->issue_ns = now;
	/* back merges grow a request between its start and its issue */
	s->remaining = args->bytes;
	return 0;
}

/*
 * The completing request's slot.  Should two requests at one sector be in
 * flight, the latest issued wins: that is right for the common case, where
 * the other one is a request whose completion the kernel skipped, and
 * merely swaps two similar latencies for two live requests.
 */
static __always_inline struct iotrace_slot *slot_find_complete(u32 dev, u64 sector, bool zero_bytes)
{
	struct iotrace_slot *best = NULL;
	u64 best_issue = 0;
	u32 h = slot_hash(dev, sector);

#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		u32 idx = (h + i) & (IOTRACE_INFLIGHT_SLOTS - 1);
		struct iotrace_slot *s = inflight.lookup(&idx);

		if (!s)
			break;
		if (s->state != IOTRACE_SLOT_BUSY || s->dev != dev || s->sector != sector ||
		    (s->remaining == 0) != zero_bytes)
			continue;
		if (!best || s->issue_ns > best_issue) {
			best = s;
			best_issue = s->issue_ns;
		}
	}
	return best;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
	u64 now = bpf_ktime_get_ns();
	u32 bytes = args->nr_sector * IOTRACE_SECTOR_SIZE;
	struct iotrace_config *cfg;
	struct iotrace_slot *s;

	if (internal_flush(args->rwbs))
		return 0;	/* counted at its issue */
	s = slot_find_complete(args->dev, args->sector, bytes == 0);
	if (!s) {
		cfg = get_config();
		if (!cfg || !cfg->enabled)
			return 0;
		if (bytes == 0)
			count_reason(IOTRACE_NOTE_FLUSH_TAIL);
		else if (cfg && (cfg->filter_pids || cfg->filter_devs))
			count_reason(IOTRACE_NOTE_UNTRACKED);
		else
			count_reason(IOTRACE_DROP_NO_START);
		return 0;
	}
	s->done += bytes;
	if (bytes && bytes < s->remaining) {
		/* partial completion: the rest continues from the next sector */
		s->remaining -= bytes;
		count_reason(IOTRACE_NOTE_PARTIAL);
		slot_move(s, args->sector + args->nr_sector);
		return 0;
	}
	record(s, now);
	slot_release(s);
	return 0;
}

TRACEPOINT_PROBE(block, block_bio_frontmerge)
{
	/* the request that began right after this bio now begins at it */
	struct iotrace_slot *s = slot_find(args->dev, args->sector + args->nr_sector, false);

	if (!s)
		return 0;
	count_reason(IOTRACE_NOTE_FRONT_MERGE);
	slot_move(s, args->sector);
	return 0;
}

TRACEPOINT_PROBE(block, block_rq_merge)
{
	/* this request was folded into another and will never complete */
	struct iotrace_slot *s = slot_find(args->dev, args->sector, args->bytes == 0);

	if (!s)
		return 0;
	count_reason(IOTRACE_NOTE_MERGED);
	slot_release(s);
	return 0;
}

TRACEPOINT_PROBE(block, block_rq_requeue)
{
	count_reason(IOTRACE_NOTE_REQUEUE);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
	struct iotrace_config *cfg = get_config();
	/* the forking thread's process, not its thread id (args->parent_pid) */
	u32 parent = bpf_get_current_pid_tgid() >> 32, child = args->child_pid;
	u8 one = 1;

	if (!cfg || !cfg->filter_pids || !cfg->follow_children)
		return 0;
	if (!pids.lookup(&parent))
		return 0;
	if (pids.update(&child, &one))
		count_reason(IOTRACE_DROP_PID_FULL);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	struct iotrace_config *cfg = get_config();
	u32 tid = (u32)bpf_get_current_pid_tgid();

	/* keeps the filter bounded, and a reused pid from being traced */
	if (cfg && cfg->filter_pids && cfg->follow_children)
		pids.delete(&tid);
	return 0;
}
