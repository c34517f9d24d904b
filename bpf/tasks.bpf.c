// SPDX-License-Identifier: GPL-2.0
/*
 * tasks.bpf.c - per-process I/O wait, file reads, page-cache misses, fsync
 * time and dirty-page throttling, for the "tasks" rows of every dump
 * (tracer/sources/tasks.py).
 *
 *   sched_switch      a traced thread blocks (not preempted, prev_state not
 *                     running) with task_struct.in_iowait set: note when, in
 *                     `waits` under its task_struct's address.  This is where
 *                     the kernel starts delay accounting's block-I/O delay
 *                     (delayacct_blkio_start in block_task)
 *   sched_wakeup      the thread is woken: add the time blocked to its
 *                     process's io_wait_ns (where delayacct_blkio_end runs),
 *                     and to throttle_ns when balance_dirty_pages put it there
 *   balance_dirty_pages  pause > 0: the thread's next I/O wait is throttling
 *                     (IOTRACE_TASKS_THROTTLE: where the kernel has one of
 *                     the event's prototypes contract.toml lists)
 *   sched_process_fork / exit  the pid filter follows forks; a process's
 *                     exit is stamped, and user space deletes it once read
 *
 * File reads, page-cache misses and fsync come from one of two places,
 * chosen at load by tracer/sources/tasks.py (choose_sources):
 *   default           the page cache's and ext4's own events
 *                     (bpf/pagecache.bpf.h: IOTRACE_TASKS_PC_READS, _CACHE,
 *                     _FSYNC, each only where the kernel has its event): no
 *                     program runs for any syscall
 *   IOTRACE_TASKS_SYSCALLS  (--tasks) the syscalls themselves:
 *     read, pread64, readv, preadv, preadv2
 *                     bytes returned from a regular file (page cache or not)
 *     fsync, fdatasync, sync_file_range  time inside
 *
 * With --tasks the syscalls are timed in one of two variants, chosen at load by
 * tracer/sources/tasks.py (choose_syscalls):
 *   IOTRACE_TASKS_RAW_SYSCALLS  raw sys_enter / sys_exit: one program each for
 *                     every syscall of the machine, returning after a compare
 *                     chain for any other number; fd and (at exit) number read
 *                     from struct pt_regs at BTF offsets, numbers from user space
 *   otherwise         the syscalls' perf-event tracepoints
 *                     (syscalls:sys_enter/exit_<name>): no layout needed
 * Both are driven by the kernel's sys_enter/sys_exit tracepoints, so with
 * either every syscall of every process takes the syscall-tracepoint slow
 * path.  What differs, measured with scripts/bench_tasks.py (2-CPU VM,
 * kernel 6.18, retpolines and SRSO safe-RET on; medians of 5 interleaved
 * rounds, against untraced in the same round):
 *   getppid, watched by nothing   perf-event +107 ns (x1.45)   raw +176 ns (x1.72)
 *     (pid filter: +110 vs +200): the raw variant runs its two programs, ~56
 *     ns a run each in bpf_stats, where the perf-event one tests a bitmap
 *   pread 4 KiB, traced           perf-event +1009 ns (x2.19)  raw +911 ns (x2.05)
 *   a perf-event block:block_rq_complete program beside them, fio O_DIRECT
 *     on a loop device, 3 x 10 s: perf-event 131 recursion misses (events
 *     skipped: perf-event programs share a per-CPU guard), raw 0
 * Hence raw is taken wherever it can be: it costs other tools (and iotrace's
 * own --attach tracepoint path) no events, though not less per syscall.
 *
 * Kernel structs are read only at offsets from the running kernel's BTF
 * (IOTRACE_K_*, from contract.toml's [[iotrace.kernel]], resolved by
 * tracer/sources/kernel.py).  fentry/fexit would be cheaper for the syscalls and
 * vfs_read, but tracing programs are refused on the machines measured.
 * Counters are cumulative; user space takes differences at each drain.
 */
#include "maps.bpf.h"
#include "compat.bpf.h"
#include "tasks.h"

/* preadv2's flags field; the header tree bcc compiles against may not declare it (a repeat is legal C11) */
typedef int rwf_t;

BPF_ARRAY(tconfig, struct iotrace_tasks_config, 1);
/* tgid -> 1: the traced processes, when filter_pids is set */
BPF_HASH(tpids, u32, u8, IOTRACE_TASKS_PIDS);
/* tgid -> struct iotrace_task */
BPF_HASH(tasks, u32, struct iotrace_task, IOTRACE_TASKS_ENTRIES);
/* tid -> struct iotrace_thread */
BPF_HASH(threads, u32, struct iotrace_thread, IOTRACE_TASKS_THREADS);
/* hash of a task_struct's address (wait_base) + probe -> struct iotrace_wait: a traced thread blocked in I/O wait */
BPF_ARRAY(waits, struct iotrace_wait, IOTRACE_TASKS_WAITS);
/* enum iotrace_tasks_reason -> u64 events, per CPU, never reset */
BPF_PERCPU_ARRAY(treasons, u64, IOTRACE_TASKS_REASON_COUNT);

/* maps.bpf.h's failure count: this program's counter is treasons */
static __always_inline void count_reason(u32 reason)
{
	u64 *n = treasons.lookup(&reason);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline struct iotrace_tasks_config *tcfg(void)
{
	u32 zero = 0;

	return tconfig.lookup(&zero);
}

/* Whether process tgid is traced. */
static __always_inline bool twanted(struct iotrace_tasks_config *cfg, u32 tgid)
{
	if (!cfg || !cfg->enabled)
		return false;
	return !cfg->filter_pids || tpids.lookup(&tgid);
}

/* lookup_or_init's view of tasks and threads (single maps: gen unused) */
static __always_inline void *tasks_lookup(u32 gen, const void *k) { return tasks.lookup((u32 *)k); }
static __always_inline int tasks_insert(u32 gen, const void *k, const void *v)
{
	return tasks.insert((u32 *)k, (struct iotrace_task *)v);
}
static __always_inline void *threads_lookup(u32 gen, const void *k) { return threads.lookup((u32 *)k); }
static __always_inline int threads_insert(u32 gen, const void *k, const void *v)
{
	return threads.insert((u32 *)k, (struct iotrace_thread *)v);
}

/* A new process entry's name and birth, read only when one is made (most calls find it: no clock read) */
static __always_inline void *task_init(void *arg)
{
	struct iotrace_task *fresh = arg;

	fresh->first_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(fresh->comm, sizeof(fresh->comm));
	return fresh;
}

/* The current process's entry, made if missing (the current task is that process). */
static __always_inline struct iotrace_task *current_task(u32 tgid)
{
	struct iotrace_task fresh = {};

	return lookup_or_init(tasks_lookup, tasks_insert, 0, &tgid, task_init, &fresh, IOTRACE_TASKS_DROP_TASKS_FULL);
}

/* The current thread's entry, made if missing. */
static __always_inline struct iotrace_thread *current_thread(u32 tid, u32 tgid)
{
	struct iotrace_thread fresh = { .tgid = tgid };

	return lookup_or_init(threads_lookup, threads_insert, 0, &tid, 0, &fresh, IOTRACE_TASKS_DROP_THREADS_FULL);
}

/* Whether the current task is in an I/O wait (task_struct.in_iowait, a one-bit field). */
static __always_inline bool current_in_iowait(void)
{
	return current_member(u8, IOTRACE_K_TASK_IN_IOWAIT, IOTRACE_TASKS_DROP_KERNEL_READ) &
	       IOTRACE_K_TASK_IN_IOWAIT_MASK;
}

/*
 * ---- the waits in progress, by task ---------------------------------------
 *
 * sched_switch and sched_wakeup both name the thread by its struct
 * task_struct *: keyed by that, a wakeup finds the wait without reading the
 * task (its pid, its in_iowait) and without a hash lookup, and the wakeups
 * of every other thread of the machine, almost all of them, stop at one
 * line of this array.  An entry is free while its task is 0; it is claimed
 * (tag_cas) by its thread's blocking switch and freed by that thread's
 * wakeup or exit: the two never run at once for one thread (a wakeup
 * waits until the switch has left the CPU, try_to_wake_up's p->on_cpu).
 */
static __always_inline u32 wait_base(u64 task)
{
	return (u32)((task * IOTRACE_HASH_MUL) >> 32) & (IOTRACE_TASKS_WAITS - 1) & ~(IOTRACE_TASKS_WAIT_PROBES - 1);
}

/* The entry `task` holds, or 0. */
static __always_inline struct iotrace_wait *wait_of(u64 task)
{
	u32 base = wait_base(task);

#pragma unroll
	for (u32 i = 0; i < IOTRACE_TASKS_WAIT_PROBES; i++) {
		u32 idx = base + i;
		struct iotrace_wait *w = waits.lookup(&idx);

		if (w && w->task == task)
			return w;
	}
	return 0;
}

/* An entry for `task`: the one it holds (a wakeup the kernel ran no program for), else a free one; 0 counted. */
static __always_inline struct iotrace_wait *wait_claim(u64 task)
{
	struct iotrace_wait *w = wait_of(task);
	u32 base = wait_base(task);

	if (w)
		return w;
#pragma unroll
	for (u32 i = 0; i < IOTRACE_TASKS_WAIT_PROBES; i++) {
		u32 idx = base + i;

		w = waits.lookup(&idx);
		/* two threads blocking on two CPUs may race for it: one wins */
		if (w && w->task == 0 && tag_cas(&w->task, 0, task))
			return w;
	}
	count_reason(IOTRACE_TASKS_DROP_WAITS_FULL);
	return 0;
}

#if IOTRACE_K_SCHED_SWITCH_LAST >= 3
#define switch_prev_state(ctx) ((u32)(ctx)->args[3])
#else
/* 5.10's sched_switch(preempt, prev, next) passes no prev_state: prev's own, read (compat.bpf.h) */
static __always_inline u64 task_state(u64 task)
{
	u64 state = 0;

	kread(&state, IOTRACE_K_TASK_STATE_ERA ? 8 : 4, task + IOTRACE_K_TASK_STATE, IOTRACE_TASKS_DROP_KERNEL_READ);
	return state;
}
#define switch_prev_state(ctx) task_state((ctx)->args[1])
#endif

/* sched_switch(preempt, prev, next[, prev_state]): prev is the current task */
RAW_TRACEPOINT_PROBE(sched_switch)
{
	struct iotrace_thread *th;
	struct iotrace_wait *w;
	u64 id, now;
	u32 throttled;

	/* blocking, as block_task does it: not a preemption, and not left running */
	if (ctx->args[0] & 1 || !switch_prev_state(ctx))
		return 0;
	if (!current_in_iowait())
		return 0;
	id = bpf_get_current_pid_tgid();
	if (!twanted(tcfg(), id >> 32))
		return 0;
	now = bpf_ktime_get_ns();
	/* its process's row, which the wakeup adds to: a process whose first event is a wait gets one too */
	if (!current_task(id >> 32))
		return 0;
	th = current_thread((u32)id, id >> 32);
	if (!th)
		return 0;
	th->flags |= IOTRACE_TASKS_WAITED;
	/* the wait balance_dirty_pages announced, or any other */
	throttled = th->flags & IOTRACE_TASKS_THROTTLE_NEXT;
	th->flags &= ~IOTRACE_TASKS_THROTTLE_NEXT;
	w = wait_claim(ctx->args[1]);
	if (!w)
		return 0;	/* counted */
	w->tgid = id >> 32;
	w->throttled = throttled;
	w->block_ns = now;
	return 0;
}

/* sched_wakeup(p): every wakeup of the machine; p's wait, if a traced thread's, ends */
RAW_TRACEPOINT_PROBE(sched_wakeup)
{
	struct iotrace_wait *w = wait_of(ctx->args[0]);
	struct iotrace_task *t;
	u64 start, d;
	u32 tgid, throttled;

	if (!w)
		return 0;
	start = w->block_ns;
	tgid = w->tgid;
	throttled = w->throttled;
	tag_clear(&w->task, ctx->args[0]);	/* read first: the entry is another thread's to claim once free */
	d = bpf_ktime_get_ns() - start;
	t = tasks.lookup(&tgid);
	if (!t) {
		count_reason(IOTRACE_TASKS_DROP_TASKS_FULL);
		return 0;
	}
	__sync_fetch_and_add(&t->io_wait_ns, d);
	__sync_fetch_and_add(&t->io_waits, 1);
	if (throttled) {
		__sync_fetch_and_add(&t->throttle_ns, d);
		__sync_fetch_and_add(&t->throttles, 1);
	}
	return 0;
}

#ifdef IOTRACE_TASKS_THROTTLE
/*
 * balance_dirty_pages(wb, dtc, dirty_ratelimit, task_ratelimit, dirtied,
 * period, pause, start_time); before the dtc argument (Debian 12's 6.1) the
 * limits came one by one and pause was the 11th.  contract.toml lists both
 * prototypes up to pause: IOTRACE_K_BALANCE_DIRTY_PAGES_LAST is its index
 * (compat.bpf.h bdp_pause).
 */
RAW_TRACEPOINT_PROBE(balance_dirty_pages)
{
	struct iotrace_thread *th;
	u64 id;

	/* pause > 0: io_schedule_timeout(pause) follows */
	if (bdp_pause(ctx) <= 0)
		return 0;
	id = bpf_get_current_pid_tgid();
	if (!twanted(tcfg(), id >> 32))
		return 0;
	if (!current_task(id >> 32))
		return 0;
	th = current_thread((u32)id, id >> 32);
	if (th)
		th->flags |= IOTRACE_TASKS_THROTTLE_NEXT;
	return 0;
}
#endif /* IOTRACE_TASKS_THROTTLE */

#ifdef IOTRACE_TASKS_RAW_SYSCALLS
/*
 * Threads inside a read or sync syscall that sys_enter noted (READING set,
 * or fsync_ns), machine-wide: while there are none, sys_exit returns
 * without reading pt_regs.  Raised at every note, lowered where a note is
 * cleared.  It errs only upwards, which costs that shortcut and nothing
 * else: sched_wakeup's unlocked update of the flags may, rarely, undo the
 * exit's clearing of READING (the stale flag was lowered already: the next
 * note raises it again, hence "every note") or the entry's setting (then it
 * stays one too high).  Never lowered at a thread's exit: a thread leaves
 * a syscall before it exits, so a note left then is a stale one.
 */
BPF_ARRAY(tnoted, s64, 1);

static __always_inline void noted_add(s64 n)
{
	u32 zero = 0;
	s64 *v = tnoted.lookup(&zero);

	if (v)
		__sync_fetch_and_add(v, n);
}
#else
#define noted_add(n) do { } while (0)
#endif

/* A sync of traced thread `id` begins (a sync syscall, or ext4_sync_file). */
static __always_inline void sync_enter(u64 id)
{
	struct iotrace_thread *th;
	u64 now = bpf_ktime_get_ns();

	if (!current_task(id >> 32))
		return;
	th = current_thread((u32)id, id >> 32);
	if (!th)
		return;
	th->fsync_ns = now;
	noted_add(1);
}

static __always_inline void sync_exit(void)
{
	struct iotrace_thread *th;
	struct iotrace_task *t;
	u32 tid = bpf_get_current_pid_tgid();
	u64 start;

	th = threads.lookup(&tid);
	if (!th || !th->fsync_ns)
		return;
	start = th->fsync_ns;
	th->fsync_ns = 0;
	noted_add(-1);
	t = tasks.lookup(&th->tgid);
	if (!t)
		return;
	__sync_fetch_and_add(&t->fsync_ns, bpf_ktime_get_ns() - start);
	__sync_fetch_and_add(&t->fsyncs, 1);
}

#ifdef IOTRACE_TASKS_SYSCALLS
/*
 * Whether fd of the current task is a regular file:
 * current->files->fdt->fd[fd]->f_inode->i_mode.  The fd table may be
 * replaced meanwhile (it grows under RCU; the old one stays readable), and
 * a read that fails is counted.
 */
static __always_inline bool fd_is_regular(u64 fd)
{
	u64 files = 0, fdt = 0, fds = 0, file = 0, inode = 0;
	u32 max_fds = 0;
	u16 mode = 0;
	u64 task = bpf_get_current_task();

	if (kread(&files, sizeof(files), task + IOTRACE_K_TASK_FILES, IOTRACE_TASKS_DROP_KERNEL_READ) || !files ||
	    kread(&fdt, sizeof(fdt), files + IOTRACE_K_FILES_FDT, IOTRACE_TASKS_DROP_KERNEL_READ) || !fdt ||
	    kread(&max_fds, sizeof(max_fds), fdt + IOTRACE_K_FDT_MAX_FDS, IOTRACE_TASKS_DROP_KERNEL_READ) ||
	    fd >= max_fds ||
	    kread(&fds, sizeof(fds), fdt + IOTRACE_K_FDT_FD, IOTRACE_TASKS_DROP_KERNEL_READ) || !fds ||
	    kread(&file, sizeof(file), fds + fd * 8, IOTRACE_TASKS_DROP_KERNEL_READ) || !file ||
	    kread(&inode, sizeof(inode), file + IOTRACE_K_FILE_INODE, IOTRACE_TASKS_DROP_KERNEL_READ) || !inode ||
	    kread(&mode, sizeof(mode), inode + IOTRACE_K_INODE_MODE, IOTRACE_TASKS_DROP_KERNEL_READ))
		return false;
	return (mode & IOTRACE_TASKS_S_IFMT) == IOTRACE_TASKS_S_IFREG;
}

/* A read syscall of traced thread `id` (pid_tgid) begins: note it when its fd is a regular file. */
static __always_inline void read_enter(u64 id, u32 fd)
{
	struct iotrace_thread *th;

	if (!fd_is_regular(fd))
		return;
	if (!current_task(id >> 32))
		return;
	th = current_thread((u32)id, id >> 32);
	if (th) {
		th->flags |= IOTRACE_TASKS_READING;
		noted_add(1);
	}
}

/* A read syscall returns `ret`: its bytes count if it was noted. */
static __always_inline void read_exit(long ret)
{
	struct iotrace_thread *th;
	struct iotrace_task *t;
	u32 tid = bpf_get_current_pid_tgid();

	th = threads.lookup(&tid);
	if (!th || !(th->flags & IOTRACE_TASKS_READING))
		return;
	th->flags &= ~IOTRACE_TASKS_READING;
	noted_add(-1);
	if (ret <= 0)
		return;
	t = tasks.lookup(&th->tgid);
	if (!t)
		return;
	__sync_fetch_and_add(&t->read_bytes, ret);
	__sync_fetch_and_add(&t->reads, 1);
}

#ifdef IOTRACE_TASKS_RAW_SYSCALLS
/*
 * The raw sys_enter/sys_exit tracepoints: one program each for every
 * syscall of the machine, which returns at the first compares for any other
 * syscall number.  The numbers (IOTRACE_NR_*) are the running
 * architecture's, given by user space (tracer/sources/tasks.py
 * syscall_numbers); the argument and, at exit, the number are read from
 * struct pt_regs at offsets from BTF (IOTRACE_K_REGS_*).
 */
#define READ_NR(nr) ((nr) == IOTRACE_NR_READ || (nr) == IOTRACE_NR_PREAD64 || (nr) == IOTRACE_NR_READV || \
		     (nr) == IOTRACE_NR_PREADV || (nr) == IOTRACE_NR_PREADV2)
#define SYNC_NR(nr) ((nr) == IOTRACE_NR_FSYNC || (nr) == IOTRACE_NR_FDATASYNC || (nr) == IOTRACE_NR_SYNC_FILE_RANGE)

/* Whether the running syscall is numbered from another table (x86_64: a 32-bit one, TS_COMPAT). */
static __always_inline bool compat_syscall(void)
{
#ifdef IOTRACE_K_TASK_TI_STATUS
	return current_member(u32, IOTRACE_K_TASK_TI_STATUS, IOTRACE_TASKS_DROP_KERNEL_READ) &
	       IOTRACE_TASKS_X86_TS_COMPAT;
#else
	return false;
#endif
}

/* sys_enter(regs, id) */
RAW_TRACEPOINT_PROBE(sys_enter)
{
	long nr = ctx->args[1];
	bool read = READ_NR(nr);
	u64 id, fd = 0;

	if (!read && !SYNC_NR(nr))
		return 0;
	id = bpf_get_current_pid_tgid();
	if (!twanted(tcfg(), id >> 32) || compat_syscall())
		return 0;
	if (!read) {
		sync_enter(id);
		return 0;
	}
	/* the kernel takes the fd as an unsigned int (readv's unsigned long too, in fdget) */
	if (kread(&fd, sizeof(fd), ctx->args[0] + IOTRACE_K_REGS_ARG0, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	read_enter(id, (u32)fd);
	return 0;
}

/* sys_exit(regs, ret): the number is the one sys_enter had (pt_regs' orig_ax on x86_64) */
RAW_TRACEPOINT_PROBE(sys_exit)
{
	u32 zero = 0;
	s64 *noted = tnoted.lookup(&zero);
	long nr = -1;

	/* no thread anywhere in a noted syscall: nothing to end (an array lookup, no helper call) */
	if (!noted || *noted <= 0)
		return 0;
	if (kread(&nr, sizeof(nr), ctx->args[0] + IOTRACE_K_REGS_NR, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	if (READ_NR(nr))
		read_exit(ctx->args[1]);
	else if (SYNC_NR(nr))
		sync_exit();
	return 0;
}

#else /* !IOTRACE_TASKS_RAW_SYSCALLS */
/*
 * The fallback: the syscalls' own tracepoints (perf-event ones: their
 * fields are the syscall's arguments, no pt_regs layout or syscall number
 * to know), so that no program runs for any other syscall, but every
 * syscall of the machine takes the tracepoint slow path.
 */
#define READ_SYSCALL(name) \
TRACEPOINT_PROBE(syscalls, sys_enter_ ## name) \
{ \
	u64 id = bpf_get_current_pid_tgid(); \
	if (twanted(tcfg(), id >> 32)) \
		read_enter(id, args->fd); \
	return 0; \
} \
TRACEPOINT_PROBE(syscalls, sys_exit_ ## name) { read_exit(args->ret); return 0; }
#define SYNC_SYSCALL(name) \
TRACEPOINT_PROBE(syscalls, sys_enter_ ## name) \
{ \
	u64 id = bpf_get_current_pid_tgid(); \
	if (twanted(tcfg(), id >> 32)) \
		sync_enter(id); \
	return 0; \
} \
TRACEPOINT_PROBE(syscalls, sys_exit_ ## name) { sync_exit(); return 0; }

READ_SYSCALL(read)
READ_SYSCALL(pread64)
READ_SYSCALL(readv)
READ_SYSCALL(preadv)
READ_SYSCALL(preadv2)
SYNC_SYSCALL(fsync)
SYNC_SYSCALL(fdatasync)
SYNC_SYSCALL(sync_file_range)
#endif /* IOTRACE_TASKS_RAW_SYSCALLS */
#endif /* IOTRACE_TASKS_SYSCALLS */

#include "pagecache.bpf.h"

/* sched_process_fork(parent, child): forks of traced processes join the filter */
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
	struct iotrace_tasks_config *cfg = tcfg();
	struct iotrace_task fresh = {};
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	u32 pid = 0, tgid = 0;
	u8 one = 1;

	if (!cfg || !cfg->enabled || !cfg->filter_pids || !cfg->follow_children)
		return 0;
	if (!tpids.lookup(&parent))
		return 0;
	if (kread(&pid, sizeof(pid), ctx->args[1] + IOTRACE_K_TASK_PID, IOTRACE_TASKS_DROP_KERNEL_READ) ||
	    kread(&tgid, sizeof(tgid), ctx->args[1] + IOTRACE_K_TASK_TGID, IOTRACE_TASKS_DROP_KERNEL_READ))
		return 0;
	if (pid != tgid)
		return 0;	/* a thread: its process is traced already */
	if (tpids.update(&pid, &one)) {
		count_reason(IOTRACE_TASKS_DROP_PIDS_FULL);
		return 0;
	}
	/* a row from its start, so that a child that exits without I/O still shows */
	fresh.first_ns = bpf_ktime_get_ns();
	fresh.ppid = parent;
	bpf_get_current_comm(fresh.comm, sizeof(fresh.comm));
	if (tasks.update(&pid, &fresh))
		count_reason(IOTRACE_TASKS_DROP_TASKS_FULL);
	return 0;
}

/* sched_process_exit(task, group_dead) */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
	struct iotrace_task *t;
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = id, tgid = id >> 32;
	u64 task = bpf_get_current_task();
	struct iotrace_wait *w = wait_of(task);

	/* a wait whose wakeup the kernel ran no program for: the task's address may be another's soon */
	if (w)
		tag_clear(&w->task, task);
	threads.delete(&tid);
	if (!raw_process_exit(ctx, tid, tgid))
		return 0;	/* a thread's, not its process's (compat.bpf.h) */
	t = tasks.lookup(&tgid);
	if (t) {
		/* its name at the end (after any exec); user space deletes the entry once read */
		bpf_get_current_comm(t->comm, sizeof(t->comm));
		t->exit_ns = bpf_ktime_get_ns();
	}
	tpids.delete(&tgid);
	return 0;
}
