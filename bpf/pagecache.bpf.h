/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pagecache.bpf.h - the per-process programs' default sources: file reads
 * and page-cache misses from the page cache's own events, fsync time from
 * ext4's, so that no program runs for any syscall (pasted into tasks.bpf.c
 * by tracer/sources/bpfobject.py source(); uses its maps and helpers).
 *
 *   mm_filemap_get_pages (IOTRACE_TASKS_PC_READS)
 *                     a buffered read's batch of pages: where a read begins
 *                     and ends is readpos.h's (shared with the per-file
 *                     rows), "blocked" being an I/O wait since the thread's
 *                     last batch; its pages counted once, clipped at the
 *                     inode's i_size.  Whole pages: a read that starts or
 *                     ends inside a page counts that page.
 *   mm_filemap_add_to_page_cache (IOTRACE_TASKS_PC_CACHE)
 *                     a folio added (1 << order pages), in the adder's
 *                     context: readahead adds a read's misses inside
 *                     filemap_get_pages(), before its batch's event.  Pages a
 *                     thread added are misses of its next batch when that is
 *                     of the same file; otherwise (a write's new pages, a
 *                     fault, another file) they are forgotten.  When a new
 *                     read's first traced page lies past the lowest page the
 *                     thread added to that file since its last batch, and it
 *                     blocked, the read began there: its first batch went
 *                     untraced (readpos.h), as seen for a file's first read
 *                     (3 pages short of 64 MiB in CI).  A thread that adds
 *                     pages by writing, then blocks reading the file further
 *                     on, is overcounted by the gap.
 *   ext4_sync_file_enter / _exit (IOTRACE_TASKS_PC_FSYNC)
 *                     fsync, fdatasync and msync(MS_SYNC) of ext4 files,
 *                     timed in the caller's context (xfs and btrfs have only
 *                     an enter event: not timed).
 */

#ifndef IOTRACE_PAGE_SHIFT
#error "IOTRACE_PAGE_SHIFT: the page size's log2, from user space"
#endif

#ifdef IOTRACE_TASKS_PC_CACHE
/*
 * Pages added to the cache by the current thread, kept for its next read batch of that file: counted as
 * its misses, then forgotten.  Returns the lowest of them if they were that file's, else ~0.
 */
static __always_inline u64 pc_pending_take(struct iotrace_thread *th, u64 mapping, struct iotrace_task *t)
{
	u64 first = ~0ULL;

	if (th->pend_pages && th->pend_mapping == mapping) {
		__sync_fetch_and_add(&t->missed_pages, th->pend_pages);
		first = th->pend_first;
	}
	th->pend_pages = 0;
	th->pend_mapping = 0;
	return first;
}
#else
#define pc_pending_take(th, mapping, t) (~0ULL)
#endif

#ifdef IOTRACE_TASKS_PC_READS
/* The size of the file at `mapping`, which thread `th` reads; 0 if unknown (then nothing is counted) */
static __always_inline s64 pc_file_size(struct iotrace_thread *th, u64 mapping)
{
	u64 host = read_pos_host(&th->rd, mapping, IOTRACE_TASKS_DROP_KERNEL_READ);
	s64 size = 0;

	if (!host || kread(&size, sizeof(size), host + IOTRACE_K_INODE_SIZE, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	return size;
}

/* mm_filemap_get_pages(mapping, index, last_index): a batch of a buffered read, in the reader's context */
RAW_TRACEPOINT_PROBE(mm_filemap_get_pages)
{
	u64 mapping = ctx->args[0], index = ctx->args[1], last = ctx->args[2], id, bytes, start, added;
	struct iotrace_thread *th;
	struct iotrace_task *t;
	bool waited;

	id = bpf_get_current_pid_tgid();
	if (!twanted(tcfg(), id >> 32))
		return 0;
	t = current_task(id >> 32);
	if (!t)
		return 0;
	th = current_thread((u32)id, id >> 32);
	if (!th)
		return 0;
	added = pc_pending_take(th, mapping, t);
	waited = th->flags & IOTRACE_TASKS_WAITED;
	th->flags &= ~IOTRACE_TASKS_WAITED;
	/* the same read's next batch: counted with its first */
	if (!read_pos_new(&th->rd, mapping, index, last, waited, &start))
		return 0;
	if (waited && added < start)
		start = th->rd.first = added;
	bytes = read_pos_bytes(start, last, pc_file_size(th, mapping));
	if (!bytes)
		return 0;
	__sync_fetch_and_add(&t->read_bytes, bytes);
	__sync_fetch_and_add(&t->reads, 1);
	__sync_fetch_and_add(&t->read_pages, (bytes + (1 << IOTRACE_PAGE_SHIFT) - 1) >> IOTRACE_PAGE_SHIFT);
	return 0;
}
#endif /* IOTRACE_TASKS_PC_READS */

#ifdef IOTRACE_TASKS_PC_CACHE
/* The pages of the folio at `folio`: 1 << its order (folio_order: order 0 unless PG_head is set). */
static __always_inline u64 pc_folio_pages(u64 folio)
{
	u64 flags = 0, flags_1 = 0;

	if (kread(&flags, sizeof(flags), folio + IOTRACE_K_FOLIO_FLAGS, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	if (!(flags & (1ULL << IOTRACE_K_PG_HEAD)))
		return 1;
	if (kread(&flags_1, sizeof(flags_1), folio + IOTRACE_K_FOLIO_FLAGS_1, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	return 1ULL << (flags_1 & IOTRACE_TASKS_FOLIO_ORDER_MASK & 63);
}

/* mm_filemap_add_to_page_cache(folio): the current thread added a folio to a file's cache */
RAW_TRACEPOINT_PROBE(mm_filemap_add_to_page_cache)
{
	u64 folio = ctx->args[0], mapping = 0, index = 0, id, pages;
	struct iotrace_thread *th;

	id = bpf_get_current_pid_tgid();
	if (!twanted(tcfg(), id >> 32))
		return 0;
	if (kread(&mapping, sizeof(mapping), folio + IOTRACE_K_FOLIO_MAPPING, IOTRACE_TASKS_DROP_KERNEL_READ) ||
	    kread(&index, sizeof(index), folio + IOTRACE_K_FOLIO_INDEX, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	pages = pc_folio_pages(folio);
	if (!pages)
		return 0;
	th = current_thread((u32)id, id >> 32);
	if (!th)
		return 0;
	/* pending pages of another file were no miss of a read (no batch of that file followed) */
	if (th->pend_mapping != mapping || !th->pend_pages) {
		th->pend_mapping = mapping;
		th->pend_pages = 0;
		th->pend_first = index;
	}
	if (index < th->pend_first)
		th->pend_first = index;
	th->pend_pages += pages;
	return 0;
}
#endif /* IOTRACE_TASKS_PC_CACHE */

#ifdef IOTRACE_TASKS_PC_FSYNC
/* ext4_sync_file_enter(file, datasync) */
RAW_TRACEPOINT_PROBE(ext4_sync_file_enter)
{
	u64 id = bpf_get_current_pid_tgid();

	if (twanted(tcfg(), id >> 32))
		sync_enter(id);
	return 0;
}

/* ext4_sync_file_exit(inode, ret) */
RAW_TRACEPOINT_PROBE(ext4_sync_file_exit)
{
	sync_exit();
	return 0;
}
#endif /* IOTRACE_TASKS_PC_FSYNC */
