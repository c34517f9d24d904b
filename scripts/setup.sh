#!/usr/bin/env bash
# Prepare this machine (Debian) for iotrace: system packages, kernel headers
# for bcc, tracefs, the project venv and the `iotrace` command.
#
# Idempotent: each step checks first and prints one line only when it acts,
# so a run on a ready machine prints nothing.  Runs from any cwd.  Privileged
# steps use sudo when not run as root.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$(pwd -P)
VENV=$REPO/.venv
STAMP=$VENV/.iotrace-installed      # sha256 of the pyproject.toml pip last installed
LINK=/usr/local/bin/iotrace
# tmux: the tests drive `iotrace top` in it; prometheus: tests/privileged/test_prometheus.py runs its own server;
# bpftrace: tests/privileged/test_identity.py traces beside it; bpftool: tests/unit/test_btf.py checks the
# BTF reader against `bpftool btf dump`, and the bench's cost pass reads program stats with it
APT_PACKAGES=(python3-bpfcc bpfcc-tools fio tmux prometheus bpftrace bpftool)
# `setup.sh --bench`: also the peers the overhead bench runs iotrace against
if [[ ${1:-} == --bench ]]; then APT_PACKAGES+=(blktrace); fi
RELEASE=$(uname -r)
MODDIR=/lib/modules/$RELEASE
export DEBIAN_FRONTEND=noninteractive PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "setup: error: '$*' needs root: run as root or install sudo" >&2
        return 1
    fi
}

# shellcheck source=scripts/lib.sh
source "$REPO/scripts/lib.sh"

installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }

has_candidate() {
    local c
    c=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [[ -n $c && $c != "(none)" ]]
}

APT_UPDATED=
apt_update_once() {
    if [[ -z $APT_UPDATED ]]; then
        say "apt-get update"
        quiet as_root apt-get update -q
        APT_UPDATED=1
    fi
}

apt_install() {
    apt_update_once
    say "apt-get install $*"
    quiet as_root apt-get install -y -q --no-install-recommends "$@"
}

# bcc compiles against /lib/modules/$(uname -r)/build, plus .../source when
# the build tree is Debian's split, arch-only one.
headers_usable() {
    [[ -e $MODDIR/build/include/generated/autoconf.h ]] &&
        [[ -e $MODDIR/build/include/linux/kernel.h || -e $MODDIR/source/include/linux/kernel.h ]]
}

step_packages() {
    local p missing=()
    for p in "${APT_PACKAGES[@]}"; do
        if ! installed "$p"; then missing+=("$p"); fi
    done
    if ((${#missing[@]})); then apt_install "${missing[@]}"; fi
}

step_headers() {
    local exact=linux-headers-$RELEASE arch generic arch_pkg common_pkg
    if installed "$exact" || headers_usable; then return; fi
    arch=$(dpkg --print-architecture)
    generic=linux-headers-cloud-$arch
    # Decide on current package lists (a fresh machine has none).
    if ! installed "$generic"; then apt_update_once; fi
    if has_candidate "$exact"; then
        apt_install "$exact"
        return
    fi
    if ! installed "$generic" && ! has_candidate "$generic"; then generic=linux-headers-$arch; fi
    say "no $exact in apt: falling back to $generic linked into $MODDIR;" \
        "sound because the BPF code reads only tracepoint fields, never kernel structs"
    if ! installed "$generic"; then apt_install "$generic"; fi
    # The meta-package depends on Debian's arch tree, which depends on its common tree.
    arch_pkg=$(dpkg-query -W -f='${Depends}' "$generic" | grep -o 'linux-headers-[^ ,]*' || true)
    common_pkg=$(dpkg-query -W -f='${Depends}' "$arch_pkg" 2>/dev/null | grep -o 'linux-headers-[^ ,]*-common' || true)
    if [[ ! -d /usr/src/$arch_pkg || ! -d /usr/src/$common_pkg || -z $arch_pkg || -z $common_pkg ]]; then
        die "cannot find the header trees of $generic under /usr/src"
    fi
    as_root mkdir -p "$MODDIR"
    as_root ln -sfnT "/usr/src/$arch_pkg" "$MODDIR/build"
    as_root ln -sfnT "/usr/src/$common_pkg" "$MODDIR/source"
    if ! headers_usable; then die "the headers linked into $MODDIR are incomplete"; fi
}

step_tracefs() {
    if [[ ! -d /sys/kernel/tracing/events ]]; then
        say "mount tracefs on /sys/kernel/tracing"
        as_root mount -t tracefs nodev /sys/kernel/tracing
    fi
}

step_venv() {
    # bcc imports only in Debian's /usr/bin/python3, hence its venv with system site-packages.
    if [[ ! -x $VENV/bin/python ]] || ! grep -qsx 'home = /usr/bin' "$VENV/pyvenv.cfg" ||
        ! grep -qsx 'include-system-site-packages = true' "$VENV/pyvenv.cfg"; then
        say "create $VENV (/usr/bin/python3 with system site-packages, for bcc)"
        rm -rf "$VENV"
        /usr/bin/python3 -m venv --system-site-packages "$VENV"
    fi
    local hash
    hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [[ ! -x $VENV/bin/iotrace || $(cat "$STAMP" 2>/dev/null) != "$hash" ]]; then
        say "pip install -e '.[dev]' into $VENV"
        quiet "$VENV/bin/python" -m pip install -e '.[dev]'
        echo "$hash" >"$STAMP"
    fi
}

step_command() {
    if [[ $(readlink "$LINK" 2>/dev/null) != "$VENV/bin/iotrace" ]]; then
        [[ ! -e $LINK || -L $LINK ]] || die "$LINK exists and is not a symlink; remove it and re-run"
        say "link $LINK -> $VENV/bin/iotrace"
        as_root ln -sfnT "$VENV/bin/iotrace" "$LINK"
    fi
}

step_packages
step_headers
step_tracefs
step_venv
step_command
