/* SPDX-License-Identifier: GPL-2.0 */
/*
 * maps.bpf.h - the two things every iotrace program does the same way: a
 * kernel read whose failure is counted, and a hash map entry found or made.
 *
 * Each program file includes it first and defines, further down,
 *	static __always_inline void count_reason(u32 reason);
 * the increment of its own per-CPU failure-reason counter (core.bpf.h's
 * `reasons`, tasks.bpf.c's `treasons`): a caller names the reason, the
 * program file the counter.
 *
 * bcc rewrites map calls (`m.lookup(&k)`) only where they are written out,
 * never in a macro, and a map cannot be passed to a function: so the entry
 * helper takes the map's lookup and insert as functions, which the caller
 * writes as one-line wrappers.  Everything here is __always_inline: the
 * function pointers are constants at each call, and clang inlines through
 * them, so a call costs what the open-coded sequence did.
 */
#ifndef IOTRACE_MAPS_BPF_H
#define IOTRACE_MAPS_BPF_H

static __always_inline void count_reason(u32 reason);

/* Copy `size` bytes of kernel memory at `addr`; a failure counts `reason` and leaves zeroes. */
static __always_inline int kread(void *dst, u32 size, u64 addr, u32 reason)
{
	int err = bpf_probe_read_kernel(dst, size, (const void *)addr);

	if (err)
		count_reason(reason);
	return err;
}

/*
 * A hash map's lookup and insert (BPF_NOEXIST) for lookup_or_init.  `gen`
 * picks one of a pair of maps flipped each interval (user space drains the
 * other); a single map ignores it.
 */
typedef void *(*map_lookup_fn)(u32 gen, const void *key);
typedef int (*map_insert_fn)(u32 gen, const void *key, const void *val);
/* The value to insert, made only on a miss (a hit costs one lookup); 0 gives up, uncounted. */
typedef void *(*map_init_fn)(void *arg);

/*
 * The value of `key`, inserted if absent: lookup; else insert the value
 * init(arg) gives (with init 0: arg itself) and lookup again.  The insert
 * fails with -EEXIST when another CPU made the entry first: the lookup then
 * finds that one.  No entry after it (the map is full) counts `reason`.
 */
static __always_inline void *lookup_or_init(map_lookup_fn lookup, map_insert_fn insert, u32 gen, const void *key,
					    map_init_fn init, void *arg, u32 reason)
{
	void *v = lookup(gen, key), *fresh;

	if (v)
		return v;
	fresh = init ? init(arg) : arg;
	if (!fresh)
		return 0;
	insert(gen, key, fresh);
	v = lookup(gen, key);
	if (!v)
		count_reason(reason);
	return v;
}

#endif /* IOTRACE_MAPS_BPF_H */
