// SPDX-License-Identifier: GPL-2.0
/*
 * raw_tp.bpf.c - iotrace's programs on raw tracepoints, for kernels with BTF.
 *
 * A request is its struct request *: no matching, nothing to re-key on
 * merges or partial completions.  Kernel structs are read at offsets taken
 * from the running kernel's BTF (IOTRACE_K_*).  Each program has its own
 * recursion guard.  The shared core (slots, histograms, accounting, filters)
 * is core.bpf.h; the loader (tracer/sources/probe.py) compiles this file or
 * tracepoint.bpf.c, never both, and substitutes IOTRACE_START_EVENT
 * (block_io_start, or on kernels before it block_getrq: compat.bpf.h).
 */
#include "maps.bpf.h"
#include "compat.bpf.h"
#include "core.bpf.h"
#include "writeback.bpf.h"
#ifndef IOTRACE_NO_FILES	/* per-file rows: trace mode's (the loader's ProbeOptions.files) */
#include "files.bpf.h"
#endif

/*
 * ---- raw tracepoints: a request is its struct request * -----------------
 *
 * The programs get the tracepoint's own arguments (ctx->args[]) and read
 * the kernel structs behind them at the offsets, and compare with the enum
 * values, that tracer/sources/kernel.py took from the running kernel's BTF and
 * passed as IOTRACE_K_* (the list is [[iotrace.kernel]] in contract.toml): bcc
 * applies no CO-RE relocation, and its header tree may be another
 * kernel's.  A raw tracepoint program has a recursion guard of its own,
 * so no other BPF program running on the CPU makes the kernel skip it.
 */

/*
 * --stamps kernel (IOTRACE_KERNEL_STAMPS): a request's times are the
 * kernel's own stamps, read at its completion with the rest of its head:
 * its start is rq->start_time_ns (stamped by blk_account_io_start right
 * after block_io_start fires, on a disk that keeps I/O statistics: iostat's
 * await is computed from it) and its issue rq->io_start_time_ns (stamped at
 * each issue while RQF_STATS is set).  No program runs on block_rq_issue.
 * The start program still dates its slot: its time tells a stale slot and
 * a lost request (user space's ledger), in CLOCK_MONOTONIC, from the tick
 * count where user space calibrated it (start_clock), else the clock; a
 * request the kernel gave no start stamp (iostats turned off since the
 * start) is timed from it, and counted.
 */
#ifdef IOTRACE_START_TICK_NS
/*
 * With the kernel's stamps the start's own time only dates its slot (the
 * lost-request ledger, a stale slot's take-over) and times the rare
 * request the kernel gave no start stamp.  The tick count serves: as
 * CLOCK_MONOTONIC (less than three ticks behind it, never ahead: user
 * space's calibration, tracer/sources/ticks.py), for a fraction of a clock
 * read's cost (measured: docs/costs.md).
 */
static __always_inline u64 start_clock(void)
{
	struct iotrace_config *cfg = get_config();

	return bpf_jiffies64() * IOTRACE_START_TICK_NS + (cfg ? cfg->tick_base : 0);
}
/* The clock at a start whose own time is `now`: read, for `now` is the tick count's. */
#define clock_at(now) bpf_ktime_get_ns()
#else
#define start_clock() bpf_ktime_get_ns()
#define clock_at(now) (now)
#endif

#ifdef IOTRACE_KERNEL_STAMPS
#define RQ_HEAD_BYTES IOTRACE_K_RQ_STAMPED_HEAD_LEN
#else
#define RQ_HEAD_BYTES IOTRACE_K_RQ_HEAD_LEN
#endif

/* The start of a struct request up to the last member the completion reads: one read, not four. */
struct rq_head {
	u64 w[(RQ_HEAD_BYTES + 7) / 8];
};
#define HEAD_FIELD(h, type, off) (*(type *)((u8 *)(h)->w + (off)))

/* cpu * IOTRACE_QDEV_SLOTS + hash of the queue -> struct iotrace_qdev: a queue's disk, read lately */
BPF_ARRAY(qdevs, struct iotrace_qdev, IOTRACE_CPUS * IOTRACE_QDEV_SLOTS);

/*
 * The whole disk's dev_t, as the block tracepoints give it: rq->q->disk's
 * major and first minor; 0, counted, where it cannot be read.
 */
static __always_inline u32 read_queue_dev(u64 q, u64 disk)
{
	u32 mm[2] = {};		/* gendisk.major, gendisk.first_minor: side by side */

	/* the disk, where the request does not hold it (compat.bpf.h rq_disk_of) */
	if (!IOTRACE_K_RQ_DISK_ERA && q && kread(&disk, sizeof(disk), q + IOTRACE_K_RQ_DISK, IOTRACE_DROP_KERNEL_READ))
		return 0;	/* counted */
	if (!disk) {
		count_reason(IOTRACE_DROP_KERNEL_READ);
		return 0;
	}
	if (kread(mm, sizeof(mm), disk + IOTRACE_K_DISK_MAJOR, IOTRACE_DROP_KERNEL_READ))
		return 0;
	return (mm[0] << 20) | mm[1];	/* the kernel's MKDEV */
}

/* dev_wanted(dev) as struct iotrace_qdev keeps it: not yet known before the filters are written */
static __always_inline u32 qdev_verdict(u32 dev)
{
	struct iotrace_config *cfg = get_config();

	if (!cfg || !cfg->enabled)
		return IOTRACE_QDEV_NOT_YET;
	return dev_wanted(dev) ? IOTRACE_QDEV_WANTED : IOTRACE_QDEV_UNWANTED;
}

/*
 * read_queue_dev() through this CPU's cache of queues (struct iotrace_qdev
 * says why that is safe), and in `*wanted` dev_wanted() of it, kept there
 * too; 0 (not wanted) where the disk cannot be read.
 */
static __always_inline u32 queue_dev(u64 q, u64 part, u64 disk, u64 now, bool *wanted)
{
	u32 cpu = bpf_get_smp_processor_id(), idx, dev;
	struct iotrace_qdev *c;

	idx = cpu * IOTRACE_QDEV_SLOTS + (u32)(key_hash(0, q) >> 32) % IOTRACE_QDEV_SLOTS;
	c = cpu < IOTRACE_CPUS ? qdevs.lookup(&idx) : 0;
	if (!c) {
		dev = read_queue_dev(q, disk);
		*wanted = dev && dev_wanted(dev);
		return dev;
	}
	if (c->q != q || c->part != part || now - c->ns > IOTRACE_QDEV_TTL_NS) {
		dev = read_queue_dev(q, disk);
		if (!dev) {
			*wanted = false;
			return 0;	/* not kept: the next request reads again */
		}
		c->dev = dev;
		c->q = q;
		c->part = part;
		c->ns = now;
		c->wanted = qdev_verdict(dev);
	} else if (c->wanted == IOTRACE_QDEV_NOT_YET) {
		c->wanted = qdev_verdict(c->dev);
	}
	*wanted = c->wanted == IOTRACE_QDEV_WANTED;
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

/*
 * Whether --dev leaves the request at `rq`, starting at `now`, out: its
 * disk, read (then cached) only when there is a device filter, so that
 * other disks' requests take no slot.  A failed read is counted and leaves
 * it out.  The cache's age is the clock's (clock_at: the start's own time
 * where that is the clock, else a reading; the tick count's lags up to
 * three ticks), so that an entry is trusted IOTRACE_QDEV_TTL_NS.
 */
static __always_inline bool dev_filtered_out(u64 rq, u64 now)
{
	struct iotrace_config *cfg = get_config();
	struct rq_head h;
	bool wanted;

	if (!cfg || !cfg->filter_devs)
		return false;
	if (kread(&h, sizeof(h), rq, IOTRACE_DROP_KERNEL_READ))
		return true;
	queue_dev(HEAD_FIELD(&h, u64, IOTRACE_K_RQ_Q), HEAD_FIELD(&h, u64, IOTRACE_K_RQ_PART), rq_disk_of(&h),
		  clock_at(now), &wanted);
	return !wanted;
}

static __always_inline bool scan_for(u32 base, u64 addr, struct slot_ref *r)
{
	u64 *t = group_tags(base);

	if (!t)
		return false;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (t[i] == addr)
			return ref_at(t, base, i, r);
	}
	return false;
}

/* The slot whose key is `addr`, taken or not. */
static __always_inline bool addr_slot(u64 addr, struct slot_ref *r)
{
	u64 h = key_hash(0, addr);
	u32 home = group_of(h), other = second_group_of(h), *sp;

	if (scan_for(home, addr, r))
		return true;
	sp = spill_count(home);
	return other != home && sp && *sp && scan_for(other, addr, r);
}

/* The slot of the request (or bio) at `addr`, if it holds a life of it. */
static __always_inline bool addr_find(u64 addr, struct slot_ref *r)
{
	return addr_slot(addr, r) && slot_taken(r);
}

/* The slot's key, from its copy in the slot: right even while a stale claim swaps the tag. */
static __always_inline u64 slot_hash(const struct slot_ref *r)
{
	return key_hash(0, r->s->sector);
}

/* A request's (or bio's) address is its tag. */
static __always_inline u64 slot_tag(const struct slot_ref *r)
{
	return r->s->sector;
}

/*
 * A slot for a starting request: most often the one its address kept
 * from the request object's last life (core.bpf.h, the in-flight table),
 * found in a line of tags no completion wrote, and written without a
 * read.  That last life may not have ended: now and then (measured: 0 to
 * 34 in 2.4M requests of a loop device over a file) the kernel completes
 * a request with no block_rq_complete program run and no recursion miss
 * counted, and the object is reused within microseconds; slot_release()
 * counts it when this life ends.  One pass over the home group finds the
 * key or the first free slot; the rest of slot_claim() only when the group
 * is full.  False when no slot is left (counted here) or another key took
 * the slot over as this life began (counted at its completion).
 */
static __always_inline bool addr_claim(u64 addr, u64 now, struct slot_ref *r)
{
	u64 h = key_hash(0, addr);
	u32 home = group_of(h), free = IOTRACE_INFLIGHT_PROBES, *sp;
	u64 *t = group_tags(home);

	if (!t)
		return false;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_INFLIGHT_PROBES; i++) {
		if (t[i] == addr) {
			if (!ref_at(t, home, i, r))
				return false;
			goto restart;
		}
		if (t[i] == 0 && free == IOTRACE_INFLIGHT_PROBES)
			free = i;
	}
	sp = spill_count(home);
	if (sp && *sp && scan_for(second_group_of(h), addr, r))
		goto restart;
	/* two CPUs may race for the same free slot: one wins, the other looks further */
	if (free < IOTRACE_INFLIGHT_PROBES && ref_at(t, home, free, r) && tag_cas(r->tag, 0, addr)) {
		slot_begin(r, now);
	} else if (!slot_claim(h, addr, now, r)) {
		count_reason(IOTRACE_DROP_INFLIGHT_FULL);
		return false;
	}
	/* the key's copy, for slot_hash(), last: claim_taken leaves a slot alone until it is the tag */
	asm volatile("" ::: "memory");
	r->s->sector = addr;
	return true;
restart:
	return slot_restart(r, addr, now);
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

/*
 * Keys of one life (core.bpf.h, key_kept): a bio's own slot (bio-level
 * timing) at its address + 1, a block_getrq start's at its address + 2.
 */
#define BIO_SLOT(bio) ((bio) | 1)
#define BIO_START(bio) ((bio) | 2)

#ifdef IOTRACE_BIO_SUBMITTED
/*
 * --bio: a request starts for this bio (its first); the bio's wait before
 * it (a tag, a plug, the queue's entry) ends here, kept as the bio slot's
 * issue time: record() makes it the bio row's queue phase.  A split bio's
 * slot is its last part's (the kernel resubmits the remainder under the
 * bio's own address), so its wait runs until that part's request started.
 */
static __always_inline void bio_request_started(u64 bio, u64 now)
{
	struct slot_ref b;

	if (bio && addr_find(BIO_SLOT(bio), &b) && !b.s->issue_ns)
		b.s->issue_ns = now;
}

/* The start of a struct bio up to the last member the completion's walk reads: one read a bio. */
struct bio_walk {
	u64 w[(IOTRACE_K_BIO_WALK_LEN + 7) / 8];
};

/* A timed bio is done: its row gets it (queue phase: its wait for a request), its slot is free. */
static __always_inline void bio_done(struct slot_ref *b, u64 now)
{
	b->s->done = b->s->remaining;
	record_once(b->s, now);
	slot_release(b);
}

/*
 * The bios a request's completion ends: its first ones, as far as its
 * bytes go.  The kernel clears their completion trace (block_rq_complete
 * stands for it), so no block_bio_complete comes for them.  A bio the
 * kernel split ends with its last part, in whichever request that is: a
 * part that is not the bio itself (bio_split's, chained to it) names the
 * bio in bi_private; __bi_remaining counts the bio's parts not yet done,
 * itself included, so it is done when this is the last.  At most
 * IOTRACE_BIO_WALK bios a request; beyond, theirs are counted lost.
 */
static __always_inline void bios_complete(u64 bio, u32 nr_bytes, u64 now)
{
	struct bio_walk h;
	struct slot_ref b;
	u32 size, left;
	u64 whose;

	for (u32 i = 0; i < IOTRACE_BIO_WALK; i++) {
		if (!bio || kread(&h, sizeof(h), bio, IOTRACE_DROP_KERNEL_READ))
			return;
		size = HEAD_FIELD(&h, u32, IOTRACE_K_BIO_SIZE);
		if (size > nr_bytes)
			return;		/* not ended by this (partial) completion */
		nr_bytes -= size;
		left = HEAD_FIELD(&h, u32, IOTRACE_K_BIO_REMAINING);
		whose = HEAD_FIELD(&h, u64, IOTRACE_K_BIO_PRIVATE);
		if (!addr_find(BIO_SLOT(bio), &b) &&
		    (!whose || !addr_find(BIO_SLOT(whose), &b) ||
		     kread(&left, sizeof(left), whose + IOTRACE_K_BIO_REMAINING, IOTRACE_DROP_KERNEL_READ)))
			left = 2;	/* no timed bio here (or its count unread): nothing ends */
		/* one call site a bio: the verifier walks record() once per step, not per branch */
		if (left <= 1)
			bio_done(&b, now);
		bio = HEAD_FIELD(&h, u64, IOTRACE_K_BIO_NEXT);
	}
	if (bio)
		count_reason(IOTRACE_DROP_BIO_WALK);
}

/*
 * A completing request's bios, when its disk's are timed as submitted (the
 * walk costs no other disk).  Three small reads, not the request's head: the
 * completion reads that too, and two copies overflow the BPF stack (6.12's
 * clang).
 */
static __always_inline void bios_of(u64 rq, u32 nr_bytes, u64 now)
{
	struct iotrace_bio_dev *bd;
	u64 q = 0, part = 0, bio = 0;
	bool wanted;	/* --dev's verdict: not --bio's, whose disks are bio_devs */
	u32 dev;

	if (kread(&q, sizeof(q), rq + IOTRACE_K_RQ_Q, IOTRACE_DROP_KERNEL_READ) ||
	    kread(&part, sizeof(part), rq + IOTRACE_K_RQ_PART, IOTRACE_DROP_KERNEL_READ))
		return;
	dev = queue_dev(q, part, 0, now, &wanted);	/* --bio: kernels whose queue has the disk (scope ["block", "block_bio_queue"]) */
	bd = dev ? bio_devs.lookup(&dev) : 0;
	if (bd && bd->mark && !kread(&bio, sizeof(bio), rq + IOTRACE_K_RQ_BIO, IOTRACE_DROP_KERNEL_READ))
		bios_complete(bio, nr_bytes, now);
}
#else
#define bio_request_started(bio, now) do {} while (0)
#endif

#ifdef IOTRACE_START_BIO
/*
 * block_getrq(bio), on kernels without block_io_start: it fires for every
 * request made from a bio, in the submitter's context, right before
 * blk_mq_bio_to_request() makes the bio the request's first (where 6.5+
 * fires block_io_start).  The request's address is not known yet, so the
 * start is kept under the bio's until block_rq_issue moves it under the
 * request's (start_from_bio).  Who, here; what and where at the completion,
 * as below; a --dev filter is applied at the issue.
 */
RAW_TRACEPOINT_PROBE(IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = bpf_ktime_get_ns(), bio = ctx->args[START_BIO_ARG], id = bpf_get_current_pid_tgid();
	struct slot_ref r;

	if (!task_wanted(id >> 32))
		return 0;
	bio_request_started(bio, now);
	if (!addr_claim(BIO_START(bio), now, &r))
		return 0;
	slot_fill(r.s, now, id, 0, 0, 0);
	return 0;
}

/*
 * The slot a block_getrq start left under one of the request's first bios:
 * rq->bio, or the bio after it, where a front merge has put another bio
 * first (IOTRACE_BIO_HOPS).  Not found: a request no filter wanted, or one
 * with no bio (the flush machinery's own); its completion says which.
 */
static __always_inline bool bio_start_of(u64 rq, struct slot_ref *b)
{
	u64 bio = 0;

	if (kread(&bio, sizeof(bio), rq + IOTRACE_K_RQ_BIO, IOTRACE_DROP_KERNEL_READ))
		return false;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_BIO_HOPS; i++) {
		if (!bio)
			return false;
		if (addr_find(BIO_START(bio), b)) {
			if (i)
				count_reason(IOTRACE_NOTE_FRONT_MERGE);
			return true;
		}
		if (i + 1 < IOTRACE_BIO_HOPS && kread(&bio, sizeof(bio), bio + IOTRACE_K_BIO_NEXT, IOTRACE_DROP_KERNEL_READ))
			return false;
	}
	return false;
}

/* At its first issue, the request takes over the start its bio held. */
static __always_inline void start_from_bio(u64 rq, u64 now)
{
	struct slot_ref b, r;

	if (!bio_start_of(rq, &b))
		return;
	if (dev_filtered_out(rq, now)) {
		slot_release(&b);
		return;
	}
	if (!addr_claim(rq, b.s->start_ns, &r)) {
		slot_release(&b);
		return;
	}
	slot_copy(r.s, b.s);
	r.s->issue_ns = now;
	slot_release(&b);
}
#else
RAW_TRACEPOINT_PROBE(IOTRACE_START_EVENT)
{
	/* first: every lookup below would otherwise show up as latency */
	u64 now = start_clock(), rq = ctx->args[0], id = bpf_get_current_pid_tgid();
	struct slot_ref r;

	/*
	 * Who, here, in the submitter's context; what and where (op, size,
	 * disk) at the completion, in the one read of the request it needs
	 * anyway.  Only with --dev is the disk read here too (then cached), so
	 * that other disks' requests take no slot.
	 */
	if (!task_wanted(id >> 32))
		return 0;
	if (dev_filtered_out(rq, now))
		return 0;
#ifdef IOTRACE_BIO_SUBMITTED
	{
		u64 bio = 0;

		if (!kread(&bio, sizeof(bio), rq + IOTRACE_K_RQ_BIO, IOTRACE_DROP_KERNEL_READ))
			bio_request_started(bio, now);
	}
#endif
	if (!addr_claim(rq, now, &r))
		return 0;
	slot_fill(r.s, now, id, 0, 0, 0);
	return 0;
}
#endif /* IOTRACE_START_BIO */

#ifndef IOTRACE_KERNEL_STAMPS
RAW_TRACEPOINT_PROBE(block_rq_issue)
{
	u64 now = bpf_ktime_get_ns(), rq = ctx->args[0];
	struct slot_ref r;

#ifdef IOTRACE_START_BIO
	if (!addr_find(rq, &r)) {
		start_from_bio(rq, now);
		return 0;
	}
	/*
	 * Issued before and not requeued since: the request object's
	 * previous life, whose completion the kernel ran no program for
	 * (see addr_claim); this life's start is its bio's.
	 */
	if (r.s->issue_ns) {
		count_reason(IOTRACE_DROP_LOST_COMPLETION);
		slot_release(&r);
		start_from_bio(rq, now);
		return 0;
	}
#else
	/*
	 * The slot the request's address keeps, taken or not: whether it is
	 * would be read in a line its last completion wrote.  A request no
	 * filter wanted writes a time its next start resets.
	 */
	if (!addr_slot(rq, &r))
		return 0;
#endif
	/* a requeued request is issued again: its device time starts anew */
	r.s->issue_ns = now;
	return 0;
}
#endif /* !IOTRACE_KERNEL_STAMPS */

#ifdef IOTRACE_KERNEL_STAMPS
/*
 * A completing request's start and issue, the kernel's stamps: its start
 * when RQF_IO_STAT says the kernel stamped one in this life (without it
 * start_time_ns is a former life's: measured, 786 s old with iostats
 * turned off; the start program's own reading is kept then, counted); its
 * issue when RQF_STATS says io_start_time_ns was stamped and it is later
 * than the start.  A request issued within its submitter's plug has both
 * stamps from the plug's one clock reading (Linux 6.9+): its queue and
 * device times are then not told apart, and only its total is recorded.
 */
static __always_inline void kernel_stamps(struct iotrace_slot *s, const struct rq_head *h)
{
	u64 start = HEAD_FIELD(h, u64, IOTRACE_K_RQ_START_NS), issue = HEAD_FIELD(h, u64, IOTRACE_K_RQ_IO_START_NS);
	u32 flags = HEAD_FIELD(h, u32, IOTRACE_K_RQ_FLAGS);

	if ((flags & (1U << IOTRACE_K_RQF_IO_STAT)) && start)
		s->start_ns = start;
	else
		count_reason(IOTRACE_NOTE_OWN_START);
	s->issue_ns = (flags & (1U << IOTRACE_K_RQF_STATS)) && issue > s->start_ns ? issue : 0;
}
#else
#define kernel_stamps(s, h) do {} while (0)
#endif

/*
 * A completion with no slot: the flush machinery's own request, or
 * count_unmatched's reasons.  A preflush/FUA data write completes twice:
 * its data (accounted, slot freed), then, once the flush sequence is done,
 * again with no bytes: that tail is no lost start.
 */
static __always_inline void rq_unmatched(u64 rq, u32 nr_bytes)
{
	u32 opf = 0;

	kread(&opf, sizeof(opf), rq + IOTRACE_K_RQ_CMD_FLAGS, IOTRACE_DROP_KERNEL_READ);
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
	bool wanted;
	struct iotrace_slot *s;
	struct rq_head h;
	struct slot_ref r;

#ifdef IOTRACE_BIO_SUBMITTED
	/* first: a bio of a request no filter wanted (merged into another's) may be timed */
	bios_of(rq, nr_bytes, now);
#endif
	/* never issued (an empty flush the flush machinery finished): its start may still be its bio's */
	if (!addr_find(rq, &r) && !start_held_by_bio(rq, &r)) {
		rq_unmatched(rq, nr_bytes);
		return 0;
	}
	s = r.s;
	if (kread(&h, sizeof(h), rq, IOTRACE_DROP_KERNEL_READ)) {
		slot_release(&r);	/* counted: neither its disk nor whether it is done can be told */
		return 0;
	}
	s->done += nr_bytes;
	if (nr_bytes < HEAD_FIELD(&h, u32, IOTRACE_K_RQ_DATA_LEN)) {
		count_reason(IOTRACE_NOTE_PARTIAL);
		return 0;
	}
	dev = queue_dev(HEAD_FIELD(&h, u64, IOTRACE_K_RQ_Q), HEAD_FIELD(&h, u64, IOTRACE_K_RQ_PART), rq_disk_of(&h), now,
			&wanted);
	if (!dev) {
		slot_release(&r);	/* counted: no disk to account it to */
		return 0;
	}
	if (!wanted) {
		count_reason(IOTRACE_NOTE_UNTRACKED);
		slot_release(&r);
		return 0;
	}
	kernel_stamps(s, &h);
	s->dev = dev;
	/* flushes are never merged: no bytes in all is no bytes at the start */
	/* the write-back mark and its dirtying window (wb_charge) stay: all above the op's code */
	s->op = opf_op(HEAD_FIELD(&h, u32, IOTRACE_K_RQ_CMD_FLAGS), s->done) | (s->op & ~(IOTRACE_OP_WB - 1));
	record_once(s, now);
#ifndef IOTRACE_NO_FILES
	file_request(HEAD_FIELD(&h, u64, IOTRACE_K_RQ_BIO), s, now);
#endif
	slot_release(&r);
	return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_merge)
{
	struct slot_ref r;

	/* this request was folded into another and will never complete (unissued: its start may be its bio's) */
	if (!addr_find(ctx->args[0], &r) && !start_held_by_bio(ctx->args[0], &r))
		return 0;
	count_reason(IOTRACE_NOTE_MERGED);
	slot_release(&r);
	return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_requeue)
{
#ifdef IOTRACE_START_BIO
	struct slot_ref r;

	/* to be issued again: block_rq_issue tells that from a stale slot by this */
	if (addr_find(ctx->args[0], &r))
		r.s->issue_ns = 0;
#endif
	count_reason(IOTRACE_NOTE_REQUEUE);
	return 0;
}

/* sched_process_fork(parent, child) */
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
	u32 child = 0;

	if (kread(&child, sizeof(child), ctx->args[1] + IOTRACE_K_TASK_PID, IOTRACE_DROP_KERNEL_READ) == 0)
		on_fork(child);
	return 0;
}

/* sched_process_exec(task, old_pid, bprm) */
RAW_TRACEPOINT_PROBE(sched_process_exec)
{
	on_exec();
	return 0;
}

/* sched_process_exit(task[, group_dead]) */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
	on_exit(raw_group_dead(ctx));
	return 0;
}

#ifndef IOTRACE_NO_WRITEBACK
#ifdef IOTRACE_DIRTY_PAGE
/* writeback_dirty_page(page, mapping), before 5.17 (contract.toml's 'dirty' events): a page at a time */
RAW_TRACEPOINT_PROBE(writeback_dirty_page)
{
	u64 inode = 0;

	if (kread(&inode, sizeof(inode), ctx->args[1] + IOTRACE_K_MAPPING_HOST, IOTRACE_NOTE_WB_UNKEPT))
		return 0;
	wb_dirtied(inode, 1ULL << IOTRACE_PAGE_SHIFT);
	return 0;
}
#else
/* writeback_dirty_folio(folio, mapping): an inode is its address, mapping->host */
RAW_TRACEPOINT_PROBE(writeback_dirty_folio)
{
	u64 inode = 0, flags = 0, flags_1 = 0, folio = ctx->args[0], order = 0;

	if (kread(&inode, sizeof(inode), ctx->args[1] + IOTRACE_K_MAPPING_HOST, IOTRACE_NOTE_WB_UNKEPT))
		return 0;
	/* the folio's size, for wb_owed: folio_order(), order 0 unless PG_head is set */
	if (!bpf_probe_read_kernel(&flags, sizeof(flags), (const void *)(folio + IOTRACE_K_WB_FOLIO_FLAGS)) &&
	    (flags & (1ULL << IOTRACE_K_WB_PG_HEAD)) &&
	    !bpf_probe_read_kernel(&flags_1, sizeof(flags_1), (const void *)(folio + IOTRACE_K_WB_FOLIO_FLAGS_1)))
		order = flags_1 & 0xff & 31;
	wb_dirtied(inode, (1ULL << IOTRACE_PAGE_SHIFT) << order);
	return 0;
}
#endif /* IOTRACE_DIRTY_PAGE */

/* writeback_single_inode_start(inode, wbc, nr_to_write) */
RAW_TRACEPOINT_PROBE(writeback_single_inode_start)
{
	wb_begin(ctx->args[0]);
	return 0;
}

/* writeback_single_inode(inode, wbc, nr_to_write): the inode's write-back is done */
RAW_TRACEPOINT_PROBE(writeback_single_inode)
{
	long left = 0, allowed = ctx->args[2];

	wb_end();
	if (!bpf_probe_read_kernel(&left, sizeof(left), (const void *)(ctx->args[1] + IOTRACE_K_WBC_NR_TO_WRITE)))
		wb_written(ctx->args[0], allowed, allowed - left);
	return 0;
}

#ifdef IOTRACE_HAVE_EXT4_SYNC_FILE_EXIT
/* ext4_sync_file_exit(inode, ret): an fsync (the whole file: fsync(2), fdatasync(2)) wrote its dirty pages */
RAW_TRACEPOINT_PROBE(ext4_sync_file_exit)
{
	u64 inode = ctx->args[0];

	if ((int)ctx->args[1] == 0 && wb_owed.lookup(&inode))
		wb_owed.delete(&inode);
	return 0;
}
#endif
#endif /* IOTRACE_NO_WRITEBACK */

#ifdef IOTRACE_HAVE_MM_FILEMAP_GET_PAGES
/* mm_filemap_get_pages(mapping, index, last_index): a read's pages asked of the page cache */
RAW_TRACEPOINT_PROBE(mm_filemap_get_pages)
{
	file_cache_read(ctx->args[0], ctx->args[1], ctx->args[2]);
	return 0;
}
#endif

#ifdef IOTRACE_HAVE_IOMAP_DIO_RW_BEGIN
/* iomap_dio_rw_begin(iocb, iter, dio_flags, done_before): an O_DIRECT read or write starts */
RAW_TRACEPOINT_PROBE(iomap_dio_rw_begin)
{
	file_direct(ctx->args[0], ctx->args[1]);
	return 0;
}
#endif

#ifdef IOTRACE_BIO_LEVEL
/* The start of a struct bio up to its last member read: one read. */
struct bio_head {
	u64 w[(IOTRACE_K_BIO_HEAD_LEN + 7) / 8];
};

/*
 * Bio-based disks (zram, device-mapper, md) have no requests: their bios
 * are timed from block_bio_queue to block_bio_complete, keyed by the bio's
 * address (BIO_SLOT), total phase only.  With --bio a request-based disk's
 * bios are timed the same way, as the application submitted them, in rows
 * of their own (IOTRACE_OP_BIO).  block_bio_queue fires once a bio (the
 * kernel marks it BIO_TRACE_COMPLETION then), before any split; its
 * block_bio_complete comes once all its parts are done.  Attached only when
 * such a disk is traced; every other disk's bios return after the bio_devs
 * lookup.
 */
RAW_TRACEPOINT_PROBE(block_bio_queue)
{
	u64 now = bpf_ktime_get_ns(), bio = ctx->args[0], bdev, id;
	struct iotrace_bio_dev *bd;
	struct bio_head h;
	struct slot_ref r;
	u32 dev = 0, bytes;

	if (kread(&h, sizeof(h), bio, IOTRACE_DROP_KERNEL_READ))
		return 0;
	bdev = HEAD_FIELD(&h, u64, IOTRACE_K_BIO_BDEV);
	if (!bdev || kread(&dev, sizeof(dev), bdev + IOTRACE_K_BDEV_DEV, IOTRACE_DROP_KERNEL_READ))
		return 0;
	id = bpf_get_current_pid_tgid();
	/* a partition's bios are its disk's (bi_bdev is the partition) */
	bd = bio_devs.lookup(&dev);
	if (!bd || !dev_wanted(bd->disk) || !task_wanted(id >> 32))
		return 0;
	if (!addr_claim(BIO_SLOT(bio), now, &r))
		return 0;
	bytes = HEAD_FIELD(&h, u32, IOTRACE_K_BIO_SIZE);
	slot_fill(r.s, now, id, bd->disk, opf_op(HEAD_FIELD(&h, u32, IOTRACE_K_BIO_OPF), bytes) | bd->mark, bytes);
	return 0;
}

/* block_bio_complete(q, bio); every disk's bios come here, so a miss is silent */
RAW_TRACEPOINT_PROBE(block_bio_complete)
{
	u64 now = bpf_ktime_get_ns();
	struct slot_ref r;

	if (!addr_find(BIO_SLOT(ctx->args[1]), &r))
		return 0;
	r.s->done = r.s->remaining;
	record_once(r.s, now);
	slot_release(&r);
	return 0;
}
#endif /* IOTRACE_BIO_LEVEL */
