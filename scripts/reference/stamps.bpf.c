// SPDX-License-Identifier: GPL-2.0
/*
 * stamps.bpf.c - the ground-truth harness's clock (scripts/reference/recorder.py,
 * class Stamper), not part of iotrace: it lives with the reference, not in bpf/.
 *
 * ftrace tells the harness what happened to every request, but it stamps
 * each event some 0.1-2 us before a BPF program at the same tracepoint
 * does (its callback runs first, and an interrupt or the hypervisor may
 * land in between), which is more than a 2% bound on microsecond queue
 * times can absorb.  These programs stamp each event at iotrace's own
 * instant instead: the kernel runs a tracepoint's BPF programs back to
 * back in the order they were attached, so one copy attached before
 * iotrace (STAMP_SIDE 0) and one after it (STAMP_SIDE 1) bracket iotrace's
 * bpf_ktime_get_ns() for every event both saw.
 *
 * The before-copy stamps once more as it returns, and that second stamp
 * stands for iotrace's (the next instructions the CPU runs are iotrace's
 * program reading the clock); the after-copy's entry stamp bounds it from
 * above, should anything have run in between.
 *
 * Like iotrace's programs they attach the way iotrace did, so that both
 * copies run in line with it: perf-event tracepoints reading tracepoint
 * fields, or (STAMP_RAW_TP) raw tracepoints reading struct request at the
 * BTF offsets iotrace uses (IOTRACE_K_*, from tracer/sources/kernel.py),
 * which also record the request's address.  Each CPU fills its own part of the array,
 * so the stamps cost no shared cache line; STAMP_DEVS is the device
 * filter, a C expression of `dev`.
 *
 * The start is stamped on the start event iotrace uses (recorder.Stamper
 * writes its name for STAMP_START_EVENT): block_io_start (Linux 6.5+), or
 * block_getrq before it, whose argument is the struct bio (STAMP_START_BIO):
 * its device and sector are read from the bio as block_getrq's own fields
 * are (bi_bdev->bd_dev: on a partition, the partition's dev; before 5.12
 * bi_disk's major and first minor, the whole disk's; bi_sector: already
 * the whole disk's), and the bio's address is recorded instead of
 * the request's; the issue then records rq->bio and the bio after it (a
 * front merge puts another first), which is how the matcher finds the
 * start of the request issued, as iotrace does; the request's address
 * from the issue on.
 */

#ifndef STAMP_SIDE
#define STAMP_SIDE 0
#endif
#ifndef STAMP_PER_CPU
#define STAMP_PER_CPU 262144
#endif
#ifndef STAMP_CPUS
#define STAMP_CPUS 1
#endif
#ifndef STAMP_DEVS
#define STAMP_DEVS 1
#endif

enum stamp_event {
	STAMP_START = 0,
	STAMP_ISSUE = 1,
	STAMP_COMPLETE = 2,
};

struct stamp {
	u64 ts;			/* bpf_ktime_get_ns() on entry */
	u64 end;		/* and on return */
	u64 sector;
	u64 rq;			/* the struct request's address (raw tracepoints, not a bio start), else 0 */
	u64 bio;		/* raw, STAMP_START_BIO: the start's bio; an issue's rq->bio; else 0 */
	u64 bio_next;		/* raw, STAMP_START_BIO: an issue's rq->bio->bi_next; else 0 */
	u32 dev;		/* kernel dev_t, as the tracepoint gives it */
	u16 cpu;
	u8 event;		/* enum stamp_event */
	u8 side;		/* STAMP_SIDE */
};

/* cpu * STAMP_PER_CPU + n -> struct stamp: each CPU's stamps in its own part, in order */
BPF_ARRAY(stamps, struct stamp, STAMP_CPUS * STAMP_PER_CPU);
/* [0] -> u64 stamps this CPU claimed, including those that did not fit (per CPU) */
BPF_PERCPU_ARRAY(claimed, u64, 1);

static __always_inline int stamp(u64 now, u8 event, u32 dev, u64 sector, u64 rq, u64 bio, u64 bio_next)
{
	u32 zero = 0, cpu = bpf_get_smp_processor_id(), idx;
	struct stamp *s;
	u64 *n;

	if (!(STAMP_DEVS))
		return 0;
	n = claimed.lookup(&zero);
	if (!n || cpu >= STAMP_CPUS)
		return 0;
	/* programs do not nest on a CPU: a plain increment is enough */
	idx = (*n)++;
	if (idx >= STAMP_PER_CPU)
		return 0;
	idx += cpu * STAMP_PER_CPU;
	s = stamps.lookup(&idx);
	if (!s)
		return 0;
	s->ts = now;
	s->sector = sector;
	s->rq = rq;
	s->bio = bio;
	s->bio_next = bio_next;
	s->dev = dev;
	s->cpu = cpu;
	s->event = event;
	s->side = STAMP_SIDE;
	s->end = bpf_ktime_get_ns();
	return 0;
}

#ifdef STAMP_RAW_TP
/* The request's disk and sector, read as iotrace reads them; then the stamp. */
static __always_inline int stamp_rq(u64 now, u8 event, u64 rq)
{
	u64 q = 0, disk = 0, sector = 0, bio = 0, bio_next = 0;
	u32 mm[2] = {};		/* gendisk.major, gendisk.first_minor */

	bpf_probe_read_kernel(&q, sizeof(q), (void *)(rq + IOTRACE_K_RQ_Q));
	bpf_probe_read_kernel(&sector, sizeof(sector), (void *)(rq + IOTRACE_K_RQ_SECTOR));
#if IOTRACE_K_RQ_DISK_ERA
	bpf_probe_read_kernel(&disk, sizeof(disk), (void *)(rq + IOTRACE_K_RQ_DISK));
#else
	if (q)
		bpf_probe_read_kernel(&disk, sizeof(disk), (void *)(q + IOTRACE_K_RQ_DISK));
#endif
	if (disk)
		bpf_probe_read_kernel(mm, sizeof(mm), (void *)(disk + IOTRACE_K_DISK_MAJOR));
#ifdef STAMP_START_BIO
	/* the bios the start may have named (before the end stamp: they cost iotrace's bracket nothing) */
	if (event == STAMP_ISSUE) {
		bpf_probe_read_kernel(&bio, sizeof(bio), (void *)(rq + IOTRACE_K_RQ_BIO));
		if (bio)
			bpf_probe_read_kernel(&bio_next, sizeof(bio_next), (void *)(bio + IOTRACE_K_BIO_NEXT));
	}
#endif
	return stamp(now, event, (mm[0] << 20) | mm[1], sector, rq, bio, bio_next);
}

#ifdef STAMP_START_BIO
/* The bio's device and sector, as block_getrq's tracepoint fields give them */
static __always_inline int stamp_bio(u64 now, u8 event, u64 bio)
{
	u64 bdev = 0, sector = 0;
	u32 dev = 0;

	bpf_probe_read_kernel(&bdev, sizeof(bdev), (void *)(bio + IOTRACE_K_BIO_BDEV));
	bpf_probe_read_kernel(&sector, sizeof(sector), (void *)(bio + IOTRACE_K_BIO_SECTOR));
#if IOTRACE_K_BIO_BDEV_ERA
	/* before 5.12: bi_disk, the whole disk (block_getrq's dev): its major and first minor */
	u32 mm[2] = {};

	if (bdev)
		bpf_probe_read_kernel(mm, sizeof(mm), (void *)(bdev + IOTRACE_K_DISK_MAJOR));
	dev = (mm[0] << 20) | mm[1];
#else
	if (bdev)
		bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(bdev + IOTRACE_K_BDEV_DEV));
#endif
	return stamp(now, event, dev, sector, 0, bio, 0);
}

RAW_TRACEPOINT_PROBE(STAMP_START_EVENT)
{
#ifdef IOTRACE_K_BLOCK_GETRQ_LAST	/* (q, bio, rw) on 5.10: the bio's index */
	return stamp_bio(bpf_ktime_get_ns(), STAMP_START, ctx->args[IOTRACE_K_BLOCK_GETRQ_LAST]);
#else
	return stamp_bio(bpf_ktime_get_ns(), STAMP_START, ctx->args[0]);
#endif
}
#else
RAW_TRACEPOINT_PROBE(STAMP_START_EVENT)
{
	return stamp_rq(bpf_ktime_get_ns(), STAMP_START, ctx->args[0]);
}
#endif

RAW_TRACEPOINT_PROBE(block_rq_issue)
{
	return stamp_rq(bpf_ktime_get_ns(), STAMP_ISSUE, ctx->args[0]);
}

RAW_TRACEPOINT_PROBE(block_rq_complete)
{
	return stamp_rq(bpf_ktime_get_ns(), STAMP_COMPLETE, ctx->args[0]);
}
#else
TRACEPOINT_PROBE(block, STAMP_START_EVENT)
{
	return stamp(bpf_ktime_get_ns(), STAMP_START, args->dev, args->sector, 0, 0, 0);
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
	return stamp(bpf_ktime_get_ns(), STAMP_ISSUE, args->dev, args->sector, 0, 0, 0);
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
	return stamp(bpf_ktime_get_ns(), STAMP_COMPLETE, args->dev, args->sector, 0, 0, 0);
}
#endif
