// SPDX-License-Identifier: GPL-2.0
/*
 * iotrace.bpf.c - per-process, per-device block I/O latency histograms.
 *
 * A request's life:
 *   block_io_start    submitter's context: claim an in-flight slot, note
 *                     tgid, tid, comm, cgroup and the op
 *   block_rq_issue    handed to the driver: note the time
 *   block_rq_complete account queue / device / total latency into this
 *                     CPU's histograms of the current generation, and
 *                     free the slot
 *
 * Two ways to attach, chosen by tracer/sources/probe.py at load (one source, the
 * other path compiled out):
 *
 *   IOTRACE_RAW_TP    raw tracepoints.  A request is its struct request *:
 *                     no matching, nothing to re-key on merges or partial
 *                     completions.  Kernel structs are read at offsets taken
 *                     from the running kernel's BTF (IOTRACE_K_*).  Each
 *                     program has its own recursion guard.
 *   otherwise         perf-event tracepoints, for kernels without BTF.  They
 *                     read tracepoint fields only (args->...), whose layout
 *                     bcc takes from the running kernel's format files, so
 *                     any header tree compiles to the same meaning.  A
 *                     request is its (dev, sector), with the heuristics
 *                     that takes.  The kernel runs one such program per CPU
 *                     at a time and skips (counting it in the program's
 *                     recursion misses) an event that fires while any
 *                     perf-event or kprobe program runs there, ours or
 *                     another tool's; a completion skipped, or now and then
 *                     lost without a count, leaves its slot taken, which
 *                     tracer/sources/probe.py finds and counts.
 *
 * Every program's skipped events (recursion misses) are reported by
 * tracer/sources/probe.py; everything else that goes wrong is counted here in the
 * reasons map.  User space flips the generation, waits out programs still
 * running on the old one, then drains it: intervals are exact and nothing
 * races a delete.  Keys, values and codes live in iotrace.h.
 *
 * tracer/sources/probe.py substitutes IOTRACE_START_CATEGORY / IOTRACE_START_EVENT
 * (block_io_start, or block_rq_insert on kernels before 6.5) and defines
 * IOTRACE_BIO_LEVEL when a bio-based disk is to be traced, and
 * IOTRACE_HAVE_GROUP_DEAD where sched_process_exit says whether a thread
 * group died.
 */
#include "iotrace.h"

/* [0] -> struct iotrace_config, written by user space */
BPF_ARRAY(config, struct iotrace_config, 1);
/* slot index -> u64 tag: odd fingerprint of the slot's (dev, sector), 0 when free */
BPF_ARRAY(tags, u64, IOTRACE_INFLIGHT_SLOTS);
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
/* struct iotrace_series_key -> struct iotrace_series_val, per CPU, generation 0 / 1 */
BPF_PERCPU_HASH(series0, struct iotrace_series_key, struct iotrace_series_val, IOTRACE_SERIES_ENTRIES);
BPF_PERCPU_HASH(series1, struct iotrace_series_key, struct iotrace_series_val, IOTRACE_SERIES_ENTRIES);
/* enum iotrace_reason -> u64 events, per CPU, never reset */
BPF_PERCPU_ARRAY(reasons, u64, IOTRACE_REASON_COUNT);
/* cpu * IOTRACE_WHO_SLOTS + tid % IOTRACE_WHO_SLOTS -> struct iotrace_who: a thread's comm and cgroup */
BPF_ARRAY(who, struct iotrace_who, IOTRACE_CPUS * IOTRACE_WHO_SLOTS);
/* tgid (or forked tid) -> 1: the processes traced when filter_pids is set */
BPF_HASH(pids, u32, u8, IOTRACE_PID_ENTRIES);
/* dev_t -> 1: the devices traced when filter_devs is set */
BPF_HASH(devs, u32, u8, IOTRACE_DEV_ENTRIES);
#ifdef IOTRACE_BIO_LEVEL
/* dev_t -> 1: bio-based disks, traced per bio (see the end of this file) */
BPF_HASH(bio_devs, u32, u8, IOTRACE_DEV_ENTRIES);
#endif

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
 * one aligned group, a single cache line, so a lookup reads one line of
 * tags and then only the slot that matches, not 8 slots; and the second
 * group's line only when its home group has spilled there.
 */
struct slot_ref {
	struct iotrace_slot *s;
	u64 *tag;
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

static __always_inline bool ref_at(u32 idx, struct slot_ref *r)
{
	r->tag = tags.lookup(&idx);
	r->s = inflight.lookup(&idx);
	r->idx = idx;
	return r->tag && r->s;
}

static __always_inline u64 slot_hash(const struct slot_ref *r);

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

static __always_inline void slot_release(struct slot_ref *r)
{
	unspill(r);
	/* a full barrier: the slot's fields are dead once its tag is 0 */
	__sync_lock_test_and_set(r->tag, 0);
}

/* Claim a free slot of the group starting at `base` for `tag`. */
static __always_inline bool claim_free(u32 base, u64 tag, struct slot_ref *r)
{
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (!ref_at(base + i, r))
			return false;
		/* two CPUs may race for the same slot: one wins */
		if (*r->tag == 0 && __sync_val_compare_and_swap(r->tag, 0, tag) == 0)
			return true;
	}
	return false;
}

/*
 * Claim a slot of the group at `base` busy for over IOTRACE_STALE_NS: its
 * completion was skipped by the kernel (user space has counted it lost) or
 * will never come.
 */
static __always_inline bool claim_stale(u32 base, u64 tag, u64 now, struct slot_ref *r)
{
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		u64 old;

		if (!ref_at(base + i, r))
			return false;
		old = *r->tag;
		/* a start_ns after `now` is a slot another CPU is filling in right now: not stale */
		if (old && r->s->start_ns < now && now - r->s->start_ns > IOTRACE_STALE_NS &&
		    __sync_val_compare_and_swap(r->tag, old, tag) == old) {
			unspill(r);	/* the old request's key is still in the slot */
			count_reason(IOTRACE_NOTE_RECLAIMED);
			return true;
		}
	}
	return false;
}

/* Claim a slot of the second group, counting the spill first: a lookup that finds it looks there. */
static __always_inline bool claim_spill(u32 home, u32 other, u64 tag, u64 now, bool stale,
					struct slot_ref *r)
{
	u32 *sp = spill_count(home);

	if (other == home || !sp)
		return false;
	__sync_fetch_and_add(sp, 1);
	if (stale ? claim_stale(other, tag, now, r) : claim_free(other, tag, r))
		return true;
	__sync_fetch_and_add(sp, -1);	/* BPF has no atomic sub */
	return false;
}

/*
 * Take a free slot for `tag` in the home group of hash `h`, else in its
 * second group, else a stale one in either.  Returns false when none is
 * left.  The caller fills in the key's fields.
 */
static __always_inline bool slot_claim(u64 h, u64 tag, u64 now, struct slot_ref *r)
{
	u32 home = group_of(h), other = second_group_of(h);

	if (!claim_free(home, tag, r) && !claim_spill(home, other, tag, now, false, r) &&
	    !claim_stale(home, tag, now, r) && !claim_spill(home, other, tag, now, true, r))
		return false;
	/* times before the key, so a CPU that sees the new key sees them too (in store
	 * order, as on x86; elsewhere the window is a few instructions wide) */
	r->s->start_ns = now;
	r->s->issue_ns = 0;
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

static __always_inline void hist_add(u32 gen, u32 cpu, struct iotrace_hist_key *k)
{
	u64 one = 1, *n;

	if (cell_add(gen, cpu, k))
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
		phase_add(gen, cpu, v, &hk, IOTRACE_PHASE_QUEUE, elapsed(s->start_ns, s->issue_ns));
		phase_add(gen, cpu, v, &hk, IOTRACE_PHASE_DEVICE, elapsed(s->issue_ns, now));
	}
	phase_add(gen, cpu, v, &hk, IOTRACE_PHASE_TOTAL, elapsed(s->start_ns, now));
}

/* ---- request start, shared by both paths -------------------------------- */

/*
 * Whether the current task's I/O is traced (process tgid).  Programs
 * attach before the filters are written, and wait for them.
 */
static __always_inline bool task_wanted(u32 tgid)
{
	struct iotrace_config *cfg = get_config();

	if (!cfg || !cfg->enabled)
		return false;
	if (cfg->filter_pids && !pids.lookup(&tgid))
		return false;
	/* in the cgroup or below it: then its ancestor at the cgroup's depth is the cgroup */
	if (cfg->filter_cgroup &&
	    bpf_get_current_ancestor_cgroup_id(cfg->cgroup_level) != cfg->filter_cgroup)
		return false;
	return true;
}

/* Whether I/O on `dev` is traced. */
static __always_inline bool dev_wanted(u32 dev)
{
	struct iotrace_config *cfg = get_config();

	return cfg && (!cfg->filter_devs || devs.lookup(&dev));
}

/* The current thread's comm and cgroup, from this CPU's cache (struct iotrace_who). */
static __always_inline struct iotrace_who *who_is(u32 tid, u64 now)
{
	u32 cpu = bpf_get_smp_processor_id(), idx = cpu * IOTRACE_WHO_SLOTS + tid % IOTRACE_WHO_SLOTS;
	struct iotrace_who *w;

	if (cpu >= IOTRACE_CPUS)
		return 0;
	w = who.lookup(&idx);
	if (!w)
		return 0;
	if (w->tid != tid || now - w->ns > IOTRACE_COMM_REUSE_NS) {
		w->cgroup = bpf_get_current_cgroup_id();
		bpf_get_current_comm(w->comm, sizeof(w->comm));
		w->tid = tid;
		w->ns = now;
	}
	return w;
}

/* Note who started the request (pid_tgid `id`) in its freshly claimed slot. */
static __always_inline void slot_fill(struct iotrace_slot *s, u64 now, u64 id, u32 dev, u32 op, u32 bytes)
{
	struct iotrace_who *w = who_is((u32)id, now);

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
	if (!pids.lookup(&parent))
		return;
	if (pids.update(&child, &one))
		count_reason(IOTRACE_DROP_PID_FULL);
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
	if (tid != tgid)
		pids.delete(&tid);
	if (group_dead)
		pids.delete(&tgid);
}

#ifdef IOTRACE_RAW_TP
/*
 * ---- raw tracepoints: a request is its struct request * -----------------
 *
 * The programs get the tracepoint's own arguments (ctx->args[]) and read
 * the kernel structs behind them at the offsets, and compare with the enum
 * values, that tracer/sources/kernel.py took from the running kernel's BTF and
 * passed as IOTRACE_K_* (the list is IOTRACE_KERNEL_TABLE in iotrace.h): bcc
 * applies no CO-RE relocation, and its header tree may be another
 * kernel's.  A raw tracepoint program has a recursion guard of its own,
 * so no other BPF program running on the CPU makes the kernel skip it.
 */

/* Copy a kernel object's bytes; a failed read is counted and leaves zeroes. */
static __always_inline int kread(void *dst, u32 size, u64 addr)
{
	int err = bpf_probe_read_kernel(dst, size, (const void *)addr);

	if (err)
		count_reason(IOTRACE_DROP_KERNEL_READ);
	return err;
}

/* The start of a struct request up to the last member the completion reads: one read, not four. */
struct rq_head {
	u64 w[(IOTRACE_K_RQ_HEAD_LEN + 7) / 8];
};
#define HEAD_FIELD(h, type, off) (*(type *)((u8 *)(h)->w + (off)))

/* cpu * IOTRACE_QDEV_SLOTS + hash of the queue -> struct iotrace_qdev: a queue's disk, read lately */
BPF_ARRAY(qdevs, struct iotrace_qdev, IOTRACE_CPUS * IOTRACE_QDEV_SLOTS);

/*
 * The whole disk's dev_t, as the block tracepoints give it: rq->q->disk's
 * major and first minor; 0, counted, where it cannot be read.
 */
static __always_inline u32 read_queue_dev(u64 q)
{
	u64 disk = 0;
	u32 mm[2] = {};		/* gendisk.major, gendisk.first_minor: side by side */

	if (q && kread(&disk, sizeof(disk), q + IOTRACE_K_Q_DISK))
		return 0;	/* counted */
	if (!disk) {
		count_reason(IOTRACE_DROP_KERNEL_READ);
		return 0;
	}
	if (kread(mm, sizeof(mm), disk + IOTRACE_K_DISK_MAJOR))
		return 0;
	return (mm[0] << 20) | mm[1];	/* the kernel's MKDEV */
}

/* read_queue_dev() through this CPU's cache of queues (struct iotrace_qdev says why that is safe) */
static __always_inline u32 queue_dev(u64 q, u64 part, u64 now)
{
	u32 cpu = bpf_get_smp_processor_id(), idx;
	struct iotrace_qdev *c;

	idx = cpu * IOTRACE_QDEV_SLOTS + (u32)(key_hash(0, q) >> 32) % IOTRACE_QDEV_SLOTS;
	c = cpu < IOTRACE_CPUS ? qdevs.lookup(&idx) : 0;
	if (!c)
		return read_queue_dev(q);
	if (c->q != q || c->part != part || now - c->ns > IOTRACE_QDEV_TTL_NS) {
		u32 dev = read_queue_dev(q);

		if (!dev)
			return 0;	/* not kept: the next request reads again */
		c->dev = dev;
		c->q = q;
		c->part = part;
		c->ns = now;
	}
	return c->dev;
}

/*
 * enum iotrace_op from cmd_flags / bi_opf and the request's bytes, as rwbs
 * at its start would name it.  An empty preflush write is a flush; by its
 * completion the flush machinery has cleared REQ_PREFLUSH from cmd_flags,
 * but a write with no data is nothing else.
 */
static __always_inline u32 opf_op(u32 opf, u32 bytes)
{
	u32 op = opf & ((1U << IOTRACE_K_REQ_OP_BITS) - 1);

	if (op == IOTRACE_K_REQ_OP_FLUSH ||
	    (bytes == 0 && (op == IOTRACE_K_REQ_OP_WRITE || (opf & (1U << IOTRACE_K_REQ_PREFLUSH)))))
		return IOTRACE_OP_FLUSH;
	if (op == IOTRACE_K_REQ_OP_READ)
		return IOTRACE_OP_READ;
	if (op == IOTRACE_K_REQ_OP_WRITE)
		return IOTRACE_OP_WRITE;
	if (op == IOTRACE_K_REQ_OP_DISCARD || op == IOTRACE_K_REQ_OP_SECURE_ERASE)
		return IOTRACE_OP_DISCARD;
	return IOTRACE_OP_OTHER;
}

static __always_inline bool scan_for(u32 base, u64 addr, struct slot_ref *r)
{
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (!ref_at(base + i, r))
			return false;
		if (*r->tag == addr)
			return true;
	}
	return false;
}

/* The slot of the request (or bio) at `addr`. */
static __always_inline bool addr_find(u64 addr, struct slot_ref *r)
{
	u64 h = key_hash(0, addr);
	u32 home = group_of(h), other = second_group_of(h), *sp;

	if (scan_for(home, addr, r))
		return true;
	sp = spill_count(home);
	return other != home && sp && *sp && scan_for(other, addr, r);
}

/* The slot's key, from its copy in the slot: right even while a stale claim swaps the tag. */
static __always_inline u64 slot_hash(const struct slot_ref *r)
{
	return key_hash(0, r->s->sector);
}

/*
 * A slot for a starting request.  Its address may still hold a slot: the
 * request object's previous life ended without a completion this program
 * saw.  Measured here: now and then (~1 in 10^4 requests of a loop device
 * over a file on another loop device) the kernel completes a request with
 * no block_rq_complete program run and no recursion miss counted, on both
 * attach paths; the request object is then reused within microseconds.
 * So the new life takes the slot over and the lost one is counted.  One pass over the home group finds either that
 * or the first free slot; the rest of slot_claim() only when the group is full.
 */
static __always_inline bool addr_claim(u64 addr, u64 now, struct slot_ref *r)
{
	u64 h = key_hash(0, addr);
	u32 home = group_of(h), free = IOTRACE_INFLIGHT_SLOTS, *sp;

#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (!ref_at(home + i, r))
			return false;
		if (*r->tag == addr)
			goto reclaim;
		if (*r->tag == 0 && free == IOTRACE_INFLIGHT_SLOTS)
			free = home + i;
	}
	sp = spill_count(home);
	if (sp && *sp && scan_for(second_group_of(h), addr, r))
		goto reclaim;
	/* two CPUs may race for the same free slot: one wins, the other looks further */
	if (free < IOTRACE_INFLIGHT_SLOTS && ref_at(free, r) && __sync_val_compare_and_swap(r->tag, 0, addr) == 0) {
		r->s->start_ns = now;
		r->s->issue_ns = 0;
		r->s->sector = addr;	/* the key's copy, for slot_hash() */
		return true;
	}
	if (!slot_claim(h, addr, now, r))
		return false;
	r->s->sector = addr;
	return true;
reclaim:
	count_reason(IOTRACE_DROP_LOST_COMPLETION);
	r->s->start_ns = now;
	r->s->issue_ns = 0;
	return true;
}

#ifdef IOTRACE_BIO_LEVEL
/* cpu -> u32: 1 while a completion program of this path accounts a request on that CPU */
BPF_ARRAY(busy, u32, IOTRACE_CPUS);

/*
 * record(), unless another completion program is accounting on this CPU
 * right now.  A raw tracepoint program guards only against itself, so
 * with bio-level tracing a bio completion may interrupt a request
 * completion's accounting (or the reverse), and the per-CPU cells and
 * series values are updated without atomics.  Counted as dropped.
 */
static __always_inline void record_once(struct iotrace_slot *s, u64 now)
{
	u32 cpu = bpf_get_smp_processor_id();
	u32 *b = busy.lookup(&cpu);

	if (b && *b) {
		count_reason(IOTRACE_DROP_NESTED);
		return;
	}
	if (b)
		*b = 1;
	record(s, now);
	if (b)
		*b = 0;
}
#else
/* only block_rq_complete accounts, and the kernel never runs it nested on a CPU */
#define record_once record
#endif

RAW_TRACEPOINT_PROBE(IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = bpf_ktime_get_ns(), rq = ctx->args[0], id = bpf_get_current_pid_tgid();
	struct slot_ref r;

	struct iotrace_config *cfg;
	struct rq_head h;

	/*
	 * Who, here, in the submitter's context; what and where (op, size,
	 * disk) at the completion, in the one read of the request it needs
	 * anyway.  Only with --dev is the disk read here too (then cached), so
	 * that other disks' requests take no slot.
	 */
	if (!task_wanted(id >> 32))
		return 0;
	cfg = get_config();
	if (cfg && cfg->filter_devs &&
	    (kread(&h, sizeof(h), rq) ||
	     !dev_wanted(queue_dev(HEAD_FIELD(&h, u64, IOTRACE_K_RQ_Q), HEAD_FIELD(&h, u64, IOTRACE_K_RQ_PART), now))))
		return 0;
	if (!addr_claim(rq, now, &r)) {
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return 0;
	}
	slot_fill(r.s, now, id, 0, 0, 0);
	return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_issue)
{
	u64 now = bpf_ktime_get_ns();
	struct slot_ref r;

	/* a requeued request is issued again: its device time starts anew */
	if (addr_find(ctx->args[0], &r))
		r.s->issue_ns = now;
	return 0;
}

/*
 * A completion with no slot: the flush machinery's own request, or
 * count_unmatched's reasons.  A preflush/FUA data write completes twice:
 * its data (accounted, slot freed), then, once the flush sequence is done,
 * again with no bytes: that tail is no lost start.
 */
static __always_inline void rq_unmatched(u64 rq, u32 nr_bytes)
{
	u32 opf = 0;

	kread(&opf, sizeof(opf), rq + IOTRACE_K_RQ_CMD_FLAGS);
	if ((opf & ((1U << IOTRACE_K_REQ_OP_BITS) - 1)) == IOTRACE_K_REQ_OP_FLUSH)
		count_reason(IOTRACE_NOTE_INTERNAL_FLUSH);
	else
		count_unmatched(nr_bytes == 0);
}

/*
 * block_rq_complete(rq, error, nr_bytes): the last one for a request
 * brings its bytes left (__data_len, before this completion) to 0.
 */
RAW_TRACEPOINT_PROBE(block_rq_complete)
{
	u64 now = bpf_ktime_get_ns(), rq = ctx->args[0];
	u32 nr_bytes = ctx->args[2], dev;
	struct iotrace_slot *s;
	struct rq_head h;
	struct slot_ref r;

	if (!addr_find(rq, &r)) {
		rq_unmatched(rq, nr_bytes);
		return 0;
	}
	s = r.s;
	if (kread(&h, sizeof(h), rq)) {
		slot_release(&r);	/* counted: neither its disk nor whether it is done can be told */
		return 0;
	}
	s->done += nr_bytes;
	if (nr_bytes < HEAD_FIELD(&h, u32, IOTRACE_K_RQ_DATA_LEN)) {
		count_reason(IOTRACE_NOTE_PARTIAL);
		return 0;
	}
	dev = queue_dev(HEAD_FIELD(&h, u64, IOTRACE_K_RQ_Q), HEAD_FIELD(&h, u64, IOTRACE_K_RQ_PART), now);
	if (!dev) {
		slot_release(&r);	/* counted: no disk to account it to */
		return 0;
	}
	if (!dev_wanted(dev)) {
		count_reason(IOTRACE_NOTE_UNTRACKED);
		slot_release(&r);
		return 0;
	}
	s->dev = dev;
	/* flushes are never merged: no bytes in all is no bytes at the start */
	s->op = opf_op(HEAD_FIELD(&h, u32, IOTRACE_K_RQ_CMD_FLAGS), s->done);
	record_once(s, now);
	slot_release(&r);
	return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_merge)
{
	struct slot_ref r;

	/* this request was folded into another and will never complete */
	if (!addr_find(ctx->args[0], &r))
		return 0;
	count_reason(IOTRACE_NOTE_MERGED);
	slot_release(&r);
	return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_requeue)
{
	count_reason(IOTRACE_NOTE_REQUEUE);
	return 0;
}

/* sched_process_fork(parent, child) */
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
	u32 child = 0;

	if (kread(&child, sizeof(child), ctx->args[1] + IOTRACE_K_TASK_PID) == 0)
		on_fork(child);
	return 0;
}

/* sched_process_exit(task[, group_dead]) */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
#ifdef IOTRACE_HAVE_GROUP_DEAD
	on_exit(ctx->args[1] & 1);
#else
	on_exit(false);
#endif
	return 0;
}

#ifdef IOTRACE_BIO_LEVEL
/* The start of a struct bio up to its last member read: one read. */
struct bio_head {
	u64 w[(IOTRACE_K_BIO_HEAD_LEN + 7) / 8];
};

/*
 * Bio-based disks (zram, device-mapper, md) have no requests: their bios
 * are timed from block_bio_queue to block_bio_complete, keyed by the bio's
 * address, total phase only.  Attached only when such a disk is traced;
 * every other disk's bios return after the bio_devs lookup.
 */
RAW_TRACEPOINT_PROBE(block_bio_queue)
{
	u64 now = bpf_ktime_get_ns(), bio = ctx->args[0], bdev, id;
	struct bio_head h;
	struct slot_ref r;
	u32 dev = 0, bytes;

	if (kread(&h, sizeof(h), bio))
		return 0;
	bdev = HEAD_FIELD(&h, u64, IOTRACE_K_BIO_BDEV);
	if (!bdev || kread(&dev, sizeof(dev), bdev + IOTRACE_K_BDEV_DEV))
		return 0;
	id = bpf_get_current_pid_tgid();
	if (!bio_devs.lookup(&dev) || !dev_wanted(dev) || !task_wanted(id >> 32))
		return 0;
	if (!addr_claim(bio, now, &r)) {
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return 0;
	}
	bytes = HEAD_FIELD(&h, u32, IOTRACE_K_BIO_SIZE);
	slot_fill(r.s, now, id, dev, opf_op(HEAD_FIELD(&h, u32, IOTRACE_K_BIO_OPF), bytes), bytes);
	return 0;
}

/* block_bio_complete(q, bio); every disk's bios come here, so a miss is silent */
RAW_TRACEPOINT_PROBE(block_bio_complete)
{
	u64 now = bpf_ktime_get_ns();
	struct slot_ref r;

	if (!addr_find(ctx->args[1], &r))
		return 0;
	r.s->done = r.s->remaining;
	record_once(r.s, now);
	slot_release(&r);
	return 0;
}
#endif /* IOTRACE_BIO_LEVEL */

#else /* !IOTRACE_RAW_TP */
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
	struct slot_ref c;

#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (!ref_at(base + i, &c))
			break;
		if (*c.tag != tag || c.s->dev != dev || c.s->sector != sector ||
		    (c.s->remaining == 0) != zero_bytes)
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
	to.s->dev = s->dev;
	to.s->sector = sector;
	to.s->op = s->op;
	to.s->issue_ns = s->issue_ns;
	to.s->cgroup = s->cgroup;
	to.s->tgid = s->tgid;
	to.s->tid = s->tid;
	to.s->remaining = s->remaining;
	to.s->done = s->done;
	__builtin_memcpy(to.s->comm, s->comm, sizeof(to.s->comm));
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

TRACEPOINT_PROBE(IOTRACE_START_CATEGORY, IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = bpf_ktime_get_ns();

	return track_start(now, args->dev, args->sector, args->bytes, args->rwbs);
}

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

TRACEPOINT_PROBE(sched, sched_process_exit)
{
#ifdef IOTRACE_HAVE_GROUP_DEAD
	on_exit(args->group_dead);
#else
	on_exit(false);
#endif
	return 0;
}

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

#endif /* IOTRACE_RAW_TP */
