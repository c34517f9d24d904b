#!/bin/bash
# PID 1 of the kernel-matrix guest, exec'ed by the image's /iotrace-init stub once /dev/vdb (the
# work-tree disk the host made for this run) is mounted on /mnt/tree:
#
#   /mnt/tree/src        the project's files (git ls-files of the host's tree)
#   /mnt/tree/run.env    what to run: IOTRACE_TESTS, time limits (written by scripts/kernels/run.py)
#   /mnt/tree/results/   what the host reads back after power-off (with debugfs: no mount on the host)
#   /mnt/tree/tmp        TMPDIR and pytest's --basetemp: the tests' loop devices sit on files there,
#                        on ext4, since tmpfs has no O_DIRECT on older kernels
#
# Everything printed goes to the serial console, which the host keeps as the run's log.
# Whatever happens, the guest powers off at the end: PID 1 must never just exit.
set -u
T=/mnt/tree
SRC=$T/src
RES=$T/results
exec >/dev/console 2>&1 </dev/null

finish() {
    echo "iotrace-guest: done, powering off"
    cd /
    sync
    umount "$T" 2>/dev/null || mount -o remount,ro "$T" 2>/dev/null
    sync
    echo o >/proc/sysrq-trigger
    sleep 30
}
trap finish EXIT

echo "iotrace-guest: up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r)"
mkdir -p "$RES" "$T/tmp"
rm -rf "${RES:?}"/* "${T:?}"/tmp/*

# What the tests expect of a booted machine (a minimal init mounts none of it).
mount -t tmpfs -o mode=1777 tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
hostname iotrace-guest
modprobe loop max_loop=64 || echo "iotrace-guest: modprobe loop failed"
modprobe mq-deadline 2>/dev/null    # built in on Debian's kernels; a module elsewhere

export PATH=/opt/iotrace-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TMPDIR=$T/tmp PYTHONDONTWRITEBYTECODE=1 IOTRACE_REQUIRE_BPF=1
# shellcheck source=/dev/null
source "$T/run.env"

# What this kernel offers the tracer, for the report.
{
    echo "kernel=$(uname -r)"
    echo "btf=$([[ -e /sys/kernel/btf/vmlinux ]] && echo yes || echo no)"
    echo "block_events=$(ls /sys/kernel/tracing/events/block | grep -v '^enable$\|^filter$' | xargs)"
    echo "boot_seconds=$(cut -d' ' -f1 /proc/uptime)"
    # what a wedged guest's timers and idle CPUs ran on (run.py's StallWatch)
    echo "clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
    echo "cpuidle=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)"
    echo "monitor=$(grep -qw monitor /proc/cpuinfo && echo yes || echo no)"
} >"$RES/guest.env"
cat "$RES/guest.env"

cd "$SRC" || exit 1
# measure NAME WHAT SCRIPT ARGS...: run scripts/kernels/SCRIPT, its JSON kept as $RES/NAME.json only
# when it finished, and how long it took as NAME_seconds in guest.env
measure() {
    local name=$1 what=$2 script=$3 t0
    shift 3
    echo "iotrace-guest: $what"
    t0=$(date +%s)
    python3 "$SRC/scripts/kernels/$script" "$@" >"$RES/$name.json.part" &&
        mv "$RES/$name.json.part" "$RES/$name.json"
    echo "${name}_seconds=$(($(date +%s) - t0))" >>"$RES/guest.env"
    sync
}
[[ ${IOTRACE_TEXT_POKE:-0} -gt 0 ]] &&
    measure textpoke "attach/detach churn under context switches" guest_textpoke.py "$IOTRACE_TEXT_POKE"
[[ ${IOTRACE_FIO:-1} == 1 ]] && measure fio "fio measurement" guest_fio.py "$SRC" "$T/tmp/fio"
[[ ${IOTRACE_PROBE_MISSES:-0} == 1 ]] &&
    measure tpmiss "perf-event skips of block_rq_complete (guest_tpmiss.py)" guest_tpmiss.py "$SRC" "$T/tmp/tpmiss"
[[ ${IOTRACE_NULLBLK:-0} == 1 ]] &&
    measure nullblk "null_blk IOPS, traced and not" guest_nullblk.py "$SRC" "${IOTRACE_NULLBLK_ROUNDS:-3}"

if [[ -z ${IOTRACE_TESTS// /} ]]; then
    echo "iotrace-guest: no tests asked for"
    exit 0
fi
echo "iotrace-guest: pytest $IOTRACE_TESTS"
# The whole list first, so that the host can name a test that never reported (a hung guest).
# shellcheck disable=SC2086
python -m pytest -p no:cacheprovider --collect-only -q $IOTRACE_TESTS >"$RES/collected.txt" 2>&1
sync
t0=$(date +%s)
# The plugin stops a test after IOTRACE_TEST_TIMEOUT and the rest after IOTRACE_SESSION_BUDGET;
# `timeout` is the backstop should pytest itself hang.
# shellcheck disable=SC2086
# TCG runs bcc's compile and the workloads several times slower than the host: the tests' own
# subprocess timeouts (tests/conftest.py run_iotrace) are doubled, up to about the plugin's limit.
PYTHONPATH=$SRC/scripts/kernels IOTRACE_RESULTS=$RES/tests.jsonl IOTRACE_TIMEOUT_SCALE=2 \
    timeout -k 10 $((${IOTRACE_SESSION_BUDGET%.*} + ${IOTRACE_TEST_TIMEOUT%.*} + 120)) \
    python -m pytest -p no:cacheprovider -p tcg_budget --basetemp="$T/tmp/pt" -q -rfE --color=no \
    $IOTRACE_TESTS
echo "pytest_rc=$?" >>"$RES/guest.env"
echo "pytest_seconds=$(($(date +%s) - t0))" >>"$RES/guest.env"
