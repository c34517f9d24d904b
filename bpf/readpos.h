/* SPDX-License-Identifier: GPL-2.0 */
/*
 * readpos.h - where one buffered read begins and ends, from the page
 * cache's own event filemap:mm_filemap_get_pages (Linux 6.12+), for both
 * programs that count reads through the page cache: the per-file rows
 * (files.bpf.h, the block-layer object) and the per-process rows
 * (pagecache.bpf.h, the per-process object).  Each keeps a struct
 * iotrace_read_pos per thread; no map here, so a plain include.
 *
 * filemap_read() and filemap_splice_read() call filemap_get_pages() once
 * per batch of folios with what is left of the read, so each batch reports
 * [its first page, the read's last page]: a read is counted at its first
 * batch, and a batch of the same file with the same last page and a later
 * first page is its continuation.
 *
 * The kernel leaves a read's first batch untraced when that batch's last
 * folio was locked (readahead's I/O in flight): filemap_update_page() waits
 * for the lock, and filemap_get_pages() returns the folios before it without
 * firing; the read's next batch fires with a later first page.  Such a
 * batch may be hundreds of pages (large folios: 208 of a 1 MiB read seen on
 * ext4, 6.18).  So a new read whose first traced page lies past where the
 * thread's previous read of the file ended, by fewer pages than that read
 * had, once the thread has blocked in between, is counted from that end: a
 * sequential reader catching up with its readahead.  A random reader that
 * blocked between reads, skipping forward less than a read's length, is
 * overcounted by the pages skipped.
 */
#ifndef IOTRACE_READPOS_H
#define IOTRACE_READPOS_H

struct iotrace_read_pos {
	u64 mapping;		/* the read last counted: its file's address_space, */
	u64 first;		/* its first page, */
	u64 last;		/* its last page (as requested, not clipped at EOF), */
	u64 index;		/* and the first page of its latest batch */
	u64 host_mapping;	/* the address_space whose inode is kept next (read_pos_host) */
	u64 host;		/* and that inode, its mapping->host */
};

/*
 * The inode of `mapping` (mapping->host), read once for the address_spaces a
 * thread reads in turn, not at every read: an address_space is its inode's
 * own i_data (inode_init_always sets host to the inode it is in), so the
 * pair holds as long as the memory holds an address_space.  0 (counted as
 * `reason`) if it cannot be read.
 */
static __always_inline u64 read_pos_host(struct iotrace_read_pos *pos, u64 mapping, u32 reason)
{
	u64 host = 0;

	if (pos->host_mapping == mapping && pos->host)
		return pos->host;
	if (kread(&host, sizeof(host), mapping + IOTRACE_K_MAPPING_HOST, reason) || !host)
		return 0;
	pos->host_mapping = mapping;
	pos->host = host;
	return host;
}

/*
 * Batch [index, last] of `mapping`, in the thread whose last read `pos` is:
 * false if it continues that read; else true, `pos` is the new read, and
 * *first its first page.  `blocked`: the thread blocked since its last batch.
 */
static __always_inline bool read_pos_new(struct iotrace_read_pos *pos, u64 mapping, u64 index, u64 last,
					 bool blocked, u64 *first)
{
	u64 next = pos->last + 1;

	if (pos->mapping == mapping && pos->last == last && index > pos->index) {
		pos->index = index;
		return false;
	}
	*first = index;
	if (blocked && pos->mapping == mapping && index > next && index - next < next - pos->first &&
	    last > pos->last)
		*first = next;
	pos->mapping = mapping;
	pos->first = *first;
	pos->last = last;
	pos->index = index;
	return true;
}

/* The bytes of pages [first, last] that lie before the end of a file of `size` bytes. */
static __always_inline u64 read_pos_bytes(u64 first, u64 last, s64 size)
{
	u64 start = first << IOTRACE_PAGE_SHIFT, end = (last + 1) << IOTRACE_PAGE_SHIFT;

	if (size <= 0)
		return 0;
	if (end > (u64)size)
		end = size;
	return end > start ? end - start : 0;
}

#endif /* IOTRACE_READPOS_H */
