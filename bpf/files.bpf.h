// SPDX-License-Identifier: GPL-2.0
/*
 * files.bpf.h - per-file rows (struct iotrace_file_key/val in iotrace.h),
 * raw-tracepoint path only: it reads kernel structs at BTF offsets.
 *
 *   a request's completion  its file: the inode of its first bio's first
 *                           page (page->mapping->host), when that page is a
 *                           page-cache page: bytes from disk or written,
 *                           its latency, under the request's process
 *                           (write-back: the dirtier's, wb_charge)
 *   mm_filemap_get_pages    (Linux 6.12+, IOTRACE_HAVE_MM_FILEMAP_GET_PAGES)
 *                           in the reader's context: the pages a read asks
 *                           of the page cache, clipped at EOF, once per read
 *                           (readpos.h, as the per-process rows count them)
 *   iomap_dio_rw_begin      (IOTRACE_HAVE_IOMAP_DIO_RW_BEGIN) O_DIRECT's bytes
 *                           as asked, in the submitter's context
 *
 * No per-syscall hook: a file's name is its dentry's (and up to
 * IOTRACE_NAME_DEPTH - 1 parents'), read once when it is first seen and
 * kept in an LRU; user space puts the mount point in front.  raw_tp.bpf.c
 * includes this after core.bpf.h and calls file_request() from its
 * completion program.
 */
#ifndef IOTRACE_FILES_BPF_H
#define IOTRACE_FILES_BPF_H

/* struct iotrace_file_key -> struct iotrace_file_val, generation 0 / 1 */
BPF_HASH(files0, struct iotrace_file_key, struct iotrace_file_val, IOTRACE_FILE_ENTRIES);
BPF_HASH(files1, struct iotrace_file_key, struct iotrace_file_val, IOTRACE_FILE_ENTRIES);
/* (dev, 0, ino) -> struct iotrace_file_name: names read, kept across intervals */
BPF_TABLE("lru_hash", struct iotrace_file_key, struct iotrace_file_name, file_names, IOTRACE_FILE_NAMES);
/* [0]: a zeroed row to insert (it is too big for the stack), [1]: a name being read */
BPF_PERCPU_ARRAY(file_zero, struct iotrace_file_val, 1);
BPF_PERCPU_ARRAY(file_scratch, struct iotrace_file_name, 1);

/*
 * A failed kernel read here counts IOTRACE_NOTE_FILE_UNREAD: it loses a file
 * row's bytes, not the request (kept in its series), so it is a note.
 */

/* The start of a struct inode up to i_size: its superblock, number and size in one read */
struct inode_head {
	u64 w[(IOTRACE_K_INODE_HEAD_LEN + 7) / 8];
};
#define INODE_FIELD(h, off) (*(u64 *)((u8 *)(h)->w + (off)))

/*
 * The inode at `inode`: its file key (dev, ino) and size; false if it cannot
 * be read, or, with `on_disk`, if its file system has no block device: a
 * request's page is then no file's page cache but memory (O_DIRECT into a
 * shared anonymous mapping is shmem's) or a block device's own (the bdev
 * pseudo file system: metadata).
 */
static __always_inline bool inode_key(u64 inode, u32 tgid, struct iotrace_file_key *k, u64 *size, bool on_disk)
{
	struct inode_head h;
	u64 sb, bdev = 0;

	if (!inode || kread(&h, sizeof(h), inode, IOTRACE_NOTE_FILE_UNREAD))
		return false;
	sb = INODE_FIELD(&h, IOTRACE_K_INODE_SB);
	k->tgid = tgid;
	k->ino = INODE_FIELD(&h, IOTRACE_K_INODE_INO);
	*size = INODE_FIELD(&h, IOTRACE_K_INODE_SIZE);
	if (!sb || kread(&k->dev, sizeof(k->dev), sb + IOTRACE_K_SB_DEV, IOTRACE_NOTE_FILE_UNREAD))
		return false;
	return !on_disk ||
	       (kread(&bdev, sizeof(bdev), sb + IOTRACE_K_SB_BDEV, IOTRACE_NOTE_FILE_UNREAD) == 0 && bdev);
}

/* The dentry names of `inode`, once per (dev, ino) while the LRU keeps it */
static __always_inline void file_name(const struct iotrace_file_key *k, u64 inode)
{
	struct iotrace_file_key nk = {.dev = k->dev, .ino = k->ino};
	struct iotrace_file_name *n;
	u64 alias = 0, d, parent = 0, name = 0;
	u32 zero = 0;

	if (file_names.lookup(&nk))
		return;
	n = file_scratch.lookup(&zero);
	if (!n || kread(&alias, sizeof(alias), inode + IOTRACE_K_INODE_DENTRY, IOTRACE_NOTE_FILE_UNREAD))
		return;
	n->depth = 0;
	n->rooted = 0;
	if (!alias)
		goto keep;	/* no dentry (unlinked and gone): user space names it by its number */
	d = alias - IOTRACE_K_DENTRY_ALIAS;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_NAME_DEPTH; i++) {
		if (kread(&parent, sizeof(parent), d + IOTRACE_K_DENTRY_PARENT, IOTRACE_NOTE_FILE_UNREAD))
			break;
		if (parent == d) {	/* the root's name is "/": not a part */
			n->rooted = 1;
			break;
		}
		if (kread(&name, sizeof(name), d + IOTRACE_K_DENTRY_NAME, IOTRACE_NOTE_FILE_UNREAD) ||
		    bpf_probe_read_kernel_str(n->part + i * IOTRACE_NAME_LEN, IOTRACE_NAME_LEN, (const void *)name) < 0)
			break;
		n->depth = i + 1;
		d = parent;
	}
	/* the last parent read may be the root */
	if (!n->rooted && n->depth == IOTRACE_NAME_DEPTH &&
	    bpf_probe_read_kernel(&parent, sizeof(parent), (const void *)(d + IOTRACE_K_DENTRY_PARENT)) == 0 &&
	    parent == d)
		n->rooted = 1;
keep:
	file_names.update(&nk, n);
}

/*
 * The row of `k` in this interval's generation, made (and its name read) if
 * new; 0 (counted) if full.  Who: `comm` and `cgroup` (a request's), or with
 * comm 0 the current task's, read only when the row is made (not through
 * the start programs' per-CPU cache: a read would fill it with a name a
 * prctl is about to change, and the requests after it would show the old).
 */
/* lookup_or_init's view of the file row pair files0/files1 */
static __always_inline void *files_lookup(u32 gen, const void *k)
{
	return gen ? files1.lookup((struct iotrace_file_key *)k) : files0.lookup((struct iotrace_file_key *)k);
}
static __always_inline int files_insert(u32 gen, const void *k, const void *v)
{
	return gen ? files1.insert((struct iotrace_file_key *)k, (struct iotrace_file_val *)v) :
		     files0.insert((struct iotrace_file_key *)k, (struct iotrace_file_val *)v);
}

/* Who a new file row is for, and whether one was made (its name is read then) */
struct file_who {
	const char *comm;
	u64 cgroup;
	bool made;
};

/* A new file row: the per-CPU zeroed one (too big for the stack) with its owner filled in */
static __always_inline void *file_init(void *arg)
{
	struct file_who *who = arg;
	struct iotrace_file_val *zero;
	u32 z = 0;

	zero = file_zero.lookup(&z);
	if (!zero)
		return 0;
	if (who->comm) {
		zero->cgroup = who->cgroup;
		__builtin_memcpy(zero->comm, who->comm, sizeof(zero->comm));
	} else {
		zero->cgroup = bpf_get_current_cgroup_id();
		bpf_get_current_comm(zero->comm, sizeof(zero->comm));
	}
	who->made = true;
	return zero;
}

static __always_inline struct iotrace_file_val *file_row(struct iotrace_file_key *k, u64 inode, u64 cgroup,
							  const char *comm)
{
	struct iotrace_config *cfg = get_config();
	struct file_who who = { .comm = comm, .cgroup = cgroup };
	struct iotrace_file_val *v;

	if (!cfg)
		return 0;
	v = lookup_or_init(files_lookup, files_insert, cfg->gen, k, file_init, &who, IOTRACE_DROP_FILES_FULL);
	if (v && who.made)
		file_name(k, inode);
	return v;
}

/* A file's latency bucket: the core's scheme with IOTRACE_FILE_HIST_SUB_BITS */
static __always_inline u64 file_bucket(u64 ns)
{
	const u64 top = (1ULL << (IOTRACE_HIST_MAX_MSB + 1)) - 1;
	u32 msb;

	if (ns < (1ULL << IOTRACE_FILE_HIST_SUB_BITS))
		return ns;
	if (ns > top)
		ns = top;
	msb = log2_u64(ns);
	return ((msb - IOTRACE_FILE_HIST_SUB_BITS + 1) << IOTRACE_FILE_HIST_SUB_BITS) |
	       ((ns >> (msb - IOTRACE_FILE_HIST_SUB_BITS)) & ((1U << IOTRACE_FILE_HIST_SUB_BITS) - 1));
}

#ifdef IOTRACE_K_BIO_PAGE_PINNED
/* The start of a struct bio up to bi_io_vec: its flags and its first vector in one read */
struct bio_file_head {
	u64 w[(IOTRACE_K_BIO_FILE_HEAD_LEN + 7) / 8];
};

/*
 * The bio_vec array of `bio`, or 0 where its pages are a process's memory
 * the kernel pinned for it (BIO_PAGE_PINNED: O_DIRECT from user space,
 * 6.5+), no file's whatever mapping they are in (its bytes are
 * iomap_dio_rw_begin's), or it cannot be read (counted).  One read of the
 * bio's head for both, where separate reads of the flags and the vector
 * cost a buffered request ~35 ns more (docs/costs.md).
 */
static __always_inline u64 bio_file_vec(u64 bio)
{
	struct bio_file_head h;

	if (kread(&h, sizeof(h), bio, IOTRACE_NOTE_FILE_UNREAD))
		return 0;
	if (*(u16 *)((u8 *)h.w + IOTRACE_K_BIO_FLAGS) & (1U << IOTRACE_K_BIO_PAGE_PINNED))
		return 0;
	return *(u64 *)((u8 *)h.w + IOTRACE_K_BIO_IO_VEC);
}
#else
/* Before 6.5 the walk below tells a process's own (anonymous) memory from a file's */
static __always_inline u64 bio_file_vec(u64 bio)
{
	u64 vec = 0;

	kread(&vec, sizeof(vec), bio + IOTRACE_K_BIO_IO_VEC, IOTRACE_NOTE_FILE_UNREAD);
	return vec;
}
#endif

/*
 * A request whose first bio is `bio` (its rq->bio, from the completion's
 * read of the request), accounted (record) with its slot `s`: its bytes and
 * latency to its file's row, if its first page is a file's page-cache page.
 */
static __always_inline void file_request(u64 bio, const struct iotrace_slot *s, u64 now)
{
	u64 vec = 0, page = 0, mapping = 0, inode = 0, size, ns;
	struct iotrace_file_key k = {};
	struct iotrace_file_val *v;
	u32 op = s->op & (IOTRACE_OP_WB - 1);	/* the code alone: no write-back mark, no window */
	u64 b;

	if ((op != IOTRACE_OP_READ && op != IOTRACE_OP_WRITE) || !s->done)
		return;
	if (!bio || !(vec = bio_file_vec(bio)) ||
	    kread(&page, sizeof(page), vec + IOTRACE_K_BVEC_PAGE, IOTRACE_NOTE_FILE_UNREAD) || !page ||
	    kread(&mapping, sizeof(mapping), page + IOTRACE_K_PAGE_MAPPING, IOTRACE_NOTE_FILE_UNREAD))
		return;
	/* no mapping (a filesystem's own buffer), or anonymous memory (the low bits: O_DIRECT's user pages) */
	if (!mapping || (mapping & 3) ||
	    kread(&inode, sizeof(inode), mapping + IOTRACE_K_MAPPING_HOST, IOTRACE_NOTE_FILE_UNREAD) ||
	    !inode_key(inode, s->tgid, &k, &size, true))
		return;
	v = file_row(&k, inode, s->cgroup, s->comm);
	if (!v)
		return;
	if (op == IOTRACE_OP_READ)
		__sync_fetch_and_add(&v->disk_read_bytes, s->done);
	else
		__sync_fetch_and_add(&v->written_bytes, s->done);
	__sync_fetch_and_add(&v->requests, 1);
	ns = now > s->start_ns ? now - s->start_ns : 0;
	__sync_fetch_and_add(&v->sum_ns, ns);
	/* a u64: the bound is checked in the register the address is made from (Linux 6.1's verifier
	 * rejected a u32 index, zero-extended once for the compare and again for the address).  The
	 * empty asm pins b to one register: Debian 13's clang otherwise compared a value from inside
	 * file_bucket and indexed with another ("R8 max value is outside of the allowed memory range") */
	b = file_bucket(ns);
	asm volatile("" : "+r"(b));
	if (b < IOTRACE_FILE_HIST_BUCKETS)
		__sync_fetch_and_add(&v->hist[b], 1);
}

#ifdef IOTRACE_HAVE_MM_FILEMAP_GET_PAGES
#include "readpos.h"

/* A thread's last read through the page cache, and its voluntary context switches then */
struct iotrace_file_reader {
	struct iotrace_read_pos pos;
	u64 nvcsw;
};

/* tid -> struct iotrace_file_reader */
BPF_TABLE("lru_hash", u32, struct iotrace_file_reader, file_readers, IOTRACE_FILE_READERS);

/*
 * A read asks the page cache for pages [index, last] of `mapping`, in the
 * reader's context: counted once per read (readpos.h; "blocked" is a
 * voluntary context switch since the thread's last batch, which this object,
 * having no scheduler program, reads from task_struct.nvcsw).
 */
static __always_inline void file_cache_read(u64 mapping, u64 index, u64 last)
{
	u64 id = bpf_get_current_pid_tgid(), inode, size, first, bytes, nvcsw;
	struct iotrace_file_reader fresh = {}, *r;
	struct iotrace_file_key k = {};
	struct iotrace_file_val *v;
	u32 tid = id;

	if (!task_wanted(id >> 32))
		return;
	nvcsw = current_member(u64, IOTRACE_K_TASK_NVCSW, IOTRACE_NOTE_FILE_UNREAD);
	r = file_readers.lookup(&tid);
	if (!r) {
		file_readers.update(&tid, &fresh);
		r = file_readers.lookup(&tid);
		if (!r)
			return;
	}
	if (!read_pos_new(&r->pos, mapping, index, last, nvcsw != r->nvcsw, &first)) {
		r->nvcsw = nvcsw;
		return;
	}
	r->nvcsw = nvcsw;
	inode = read_pos_host(&r->pos, mapping, IOTRACE_NOTE_FILE_UNREAD);
	if (!inode_key(inode, id >> 32, &k, &size, false))
		return;
	bytes = read_pos_bytes(first, last, size);
	if (!bytes)
		return;
	v = file_row(&k, inode, 0, 0);
	if (v)
		__sync_fetch_and_add(&v->cache_bytes, bytes);
}
#endif /* IOTRACE_HAVE_MM_FILEMAP_GET_PAGES */

#ifdef IOTRACE_HAVE_IOMAP_DIO_RW_BEGIN
/*
 * An O_DIRECT read or write of `iter`'s bytes on the file of `kiocb`, in the
 * submitter's context (ext4, xfs, btrfs: the iomap file systems).  Its
 * requests' pages are the process's own memory, no file's (file_request
 * skips them), so its bytes are counted here as asked: no latency; a read
 * is clipped at the file's size, but a hole counts as read.
 */
static __always_inline void file_direct(u64 kiocb, u64 iter)
{
	u64 id = bpf_get_current_pid_tgid(), filp = 0, inode = 0, count = 0, pos = 0, size;
	struct iotrace_file_key k = {};
	struct iotrace_file_val *v;
	u8 write = 0;

	if (!task_wanted(id >> 32))
		return;
	if (kread(&filp, sizeof(filp), kiocb + IOTRACE_K_KIOCB_FILP, IOTRACE_NOTE_FILE_UNREAD) || !filp ||
	    kread(&inode, sizeof(inode), filp + IOTRACE_K_FILP_INODE, IOTRACE_NOTE_FILE_UNREAD) ||
	    kread(&count, sizeof(count), iter + IOTRACE_K_ITER_COUNT, IOTRACE_NOTE_FILE_UNREAD) ||
	    kread(&write, sizeof(write), iter + IOTRACE_K_ITER_SOURCE, IOTRACE_NOTE_FILE_UNREAD) ||
	    kread(&pos, sizeof(pos), kiocb + IOTRACE_K_KIOCB_POS, IOTRACE_NOTE_FILE_UNREAD) ||
	    !count || !inode_key(inode, id >> 32, &k, &size, false))
		return;
	/* a read gets no more than the file holds */
	if (!write && (pos >= size || (s64)pos < 0))
		return;
	if (!write && count > size - pos)
		count = size - pos;
	v = file_row(&k, inode, 0, 0);
	if (!v)
		return;
	if (write)
		__sync_fetch_and_add(&v->written_bytes, count);
	else
		__sync_fetch_and_add(&v->disk_read_bytes, count);
	__sync_fetch_and_add(&v->direct_bytes, count);
}
#endif /* IOTRACE_HAVE_IOMAP_DIO_RW_BEGIN */

#endif /* IOTRACE_FILES_BPF_H */
