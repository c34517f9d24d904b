#!/usr/bin/env bash
# Build (once) the guest image `make test-kernels` boots for one Debian kernel package:
#
#   scripts/kernels/build_image.sh linux-image-6.1.0-50-cloud-amd64
#   scripts/kernels/build_image.sh linux-image-6.12.118+deb13-cloud-amd64 trixie
#   scripts/kernels/build_image.sh linux-image-5.10.0-46-cloud-amd64 bookworm bullseye
#
# (a kernels.list line: the package, the Debian release the guest is, default bookworm, and a release
# whose archive is added for the kernel and its headers when the guest's release has not got them)
# prints the cache directory holding root.img (raw ext4), vmlinuz and initrd.img.  The image lives
# outside the clone, in $IOTRACE_KERNEL_CACHE (default /var/cache/iotrace-kernels), under a hash of its
# recipe: this script, packages.list, guest-requirements.txt, the kernel package's name and the releases.  Editing any
# of them builds a new image; an unchanged recipe reuses the one built before (a clean clone included).
#
# The image: Debian SUITE (debootstrap minbase), the kernel with its headers (bcc compiles against
# /lib/modules/$(uname -r)/build), the tests' tools, and a venv with the project's pip packages, all
# installed in a chroot at build time: the guest itself never needs a network.  Its PID 1 is a stub
# (/iotrace-init) that hands over to scripts/kernels/guest_run.sh from the work-tree disk each run
# brings, so changing what runs in the guest does not rebuild the image.
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
KERNEL_PKG=${1:?usage: build_image.sh linux-image-VERSION [SUITE [KERNEL_SUITE]]}
# The guest's userland: the kernel's own release where it runs the project (Python >= 3.11: bookworm,
# trixie); an older kernel's release (bullseye has 3.9) only lends its archive, KERNEL_SUITE.
SUITE=${2:-bookworm}
KERNEL_SUITE=${3:-}
CACHE_ROOT=${IOTRACE_KERNEL_CACHE:-/var/cache/iotrace-kernels}
MIRROR=${IOTRACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${IOTRACE_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
IMAGE_SIZE=6G       # sparse: the tests' loop backing files live on the work-tree disk, not here

say() { echo "build_image: $*" >&2; }
die() { echo "build_image: error: $*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "needs root (debootstrap, chroot)"
[[ $KERNEL_PKG == linux-image-* ]] || die "$KERNEL_PKG is not a linux-image-* package"
for s in "$SUITE" $KERNEL_SUITE; do [[ $s =~ ^[a-z]+$ ]] || die "$s is not a Debian release name"; done
HEADERS_PKG=linux-headers-${KERNEL_PKG#linux-image-}

# The recipe's hash names the cache directory.
HASH=$( { cat "$HERE/build_image.sh" "$HERE/packages.list" "$HERE/guest-requirements.txt"
          echo "$KERNEL_PKG $SUITE $KERNEL_SUITE"; } | sha256sum | cut -c1-16)
OUT=$CACHE_ROOT/$HASH
if [[ -e $OUT/ready ]]; then
    say "cached: $OUT ($KERNEL_PKG)"
    echo "$OUT"
    exit 0
fi

# Host tools, installed on first use (apt-get update once if apt knows nothing of them yet).
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
if ((${#need[@]})); then
    say "apt-get install ${need[*]}"
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
fi

mapfile -t PACKAGES < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$HERE/packages.list")

mkdir -p "$CACHE_ROOT"
WORK=$(mktemp -d "$CACHE_ROOT/.build-$HASH-XXXXXX")
ROOT=$WORK/root
MOUNTED=()

# Whatever happens, nothing stays mounted on the host and the half-built tree goes.
cleanup() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" 2>/dev/null || true
    done
    # never delete through a bind mount that is somehow still there (the host's /dev, /proc, /sys)
    if grep -q " $WORK/" /proc/self/mounts; then
        echo "build_image: $WORK still has mounts; left in place" >&2
    else
        rm -rf --one-file-system "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

bind() {    # bind <host path> <path in the chroot>
    mount --bind "$1" "$ROOT$2"
    MOUNTED+=("$ROOT$2")
}

START=$(date +%s)
say "debootstrap $SUITE ($KERNEL_PKG${KERNEL_SUITE:+ from $KERNEL_SUITE}) in $WORK"
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }

cat >"$ROOT/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
# the older release's archive: apt takes from it only what $SUITE lacks (the kernel, its headers and
# their compiler), every package both have comes from $SUITE, the newer
if [[ -n $KERNEL_SUITE ]]; then
    printf 'deb %s %s main\ndeb %s %s-security main\n' "$MIRROR" "$KERNEL_SUITE" "$SECURITY" "$KERNEL_SUITE" \
        >>"$ROOT/etc/apt/sources.list"
fi
# no daemon starts inside the chroot while packages install
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod +x "$ROOT/usr/sbin/policy-rc.d"
bind /proc /proc
bind /sys /sys
bind /dev /dev
bind /dev/pts /dev/pts

in_root() { chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

say "apt-get install ${#PACKAGES[@]} packages, $KERNEL_PKG and $HEADERS_PKG"
{
    in_root apt-get update -q &&
    in_root apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" "$KERNEL_PKG" "$HEADERS_PKG"
} >"$WORK/apt.log" 2>&1 || { tail -30 "$WORK/apt.log" >&2; die "apt-get install in the chroot failed"; }

KVER=${KERNEL_PKG#linux-image-}
[[ -e $ROOT/boot/vmlinuz-$KVER ]] || die "no /boot/vmlinuz-$KVER in the chroot"
[[ -e $ROOT/boot/initrd.img-$KVER ]] || die "no /boot/initrd.img-$KVER in the chroot (initramfs-tools?)"
# inside the chroot: build is an absolute symlink into /usr/src
in_root test -e "/lib/modules/$KVER/build/include/generated/autoconf.h" || die "no kernel headers for $KVER"

# pip inside the chroot goes out the way the host's does: its pip.conf and the CA bundle it names (copied
# after apt-get: the chroot's ca-certificates package rewrites /etc/ssl/certs/ca-certificates.crt)
if [[ -e /etc/pip.conf ]]; then
    cp /etc/pip.conf "$ROOT/etc/pip.conf"
    cert=$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' /etc/pip.conf | head -1)
    if [[ -n $cert && -e $cert ]]; then mkdir -p "$ROOT$(dirname "$cert")"; cp "$cert" "$ROOT$cert"; fi
fi
if [[ -n ${PIP_CERT:-} && -e $PIP_CERT ]]; then mkdir -p "$ROOT$(dirname "$PIP_CERT")"; cp "$PIP_CERT" "$ROOT$PIP_CERT"; fi

say "venv /opt/iotrace-venv (pip: $(grep -v '^#' "$HERE/guest-requirements.txt" | xargs))"
cp "$HERE/guest-requirements.txt" "$ROOT/tmp/requirements.txt"
{
    in_root python3 -m venv --system-site-packages /opt/iotrace-venv &&
    # PIP_FIND_LINKS names a host folder that the chroot lacks
    in_root env -u PIP_FIND_LINKS PIP_DISABLE_PIP_VERSION_CHECK=1 \
        /opt/iotrace-venv/bin/pip install -q -r /tmp/requirements.txt &&
    in_root /opt/iotrace-venv/bin/python -c 'import bcc, numpy, hdrh, pytest, hypothesis'
} >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log" >&2; die "pip install in the chroot failed"; }

# PID 1: the least that finds the run script on the work-tree disk (/dev/vdb); if that fails, power off
# at once rather than leave the host waiting for its timeout.
cat >"$ROOT/iotrace-init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /mnt/tree
if mount -t ext4 /dev/vdb /mnt/tree && [ -e /mnt/tree/src/scripts/kernels/guest_run.sh ]; then
    exec /bin/bash /mnt/tree/src/scripts/kernels/guest_run.sh
fi
echo "iotrace-init: no work-tree disk on /dev/vdb" >&2
echo o >/proc/sysrq-trigger
EOF
chmod +x "$ROOT/iotrace-init"
echo iotrace-guest >"$ROOT/etc/hostname"

cleanup_mounts() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do umount "${MOUNTED[i]}"; done
    MOUNTED=()
}
cleanup_mounts
rm -f "$ROOT/usr/sbin/policy-rc.d" "$ROOT/tmp/requirements.txt"
in_root apt-get clean >/dev/null 2>&1 || true

mkdir -p "$WORK/image"
cp "$ROOT/boot/vmlinuz-$KVER" "$WORK/image/vmlinuz"
cp "$ROOT/boot/initrd.img-$KVER" "$WORK/image/initrd.img"
say "mke2fs -d: $IMAGE_SIZE sparse ext4 image"
mke2fs -q -t ext4 -L iotrace-root -d "$ROOT" "$WORK/image/root.img" "$IMAGE_SIZE" ||
    die "mke2fs -d failed"
cat >"$WORK/image/recipe.txt" <<EOF
kernel=$KERNEL_PKG
suite=$SUITE
kernel_suite=$KERNEL_SUITE
kernel_version=$KVER
headers=$HEADERS_PKG
hash=$HASH
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
build_seconds=$(($(date +%s) - START))
EOF
touch "$WORK/image/ready"
rm -rf "$OUT"
mv "$WORK/image" "$OUT"
# images of this kernel built from an older recipe are stale now: keep the disk from filling up
for old in "$CACHE_ROOT"/*/recipe.txt; do
    d=$(dirname "$old")
    if [[ $d != "$OUT" ]] && grep -qx "kernel=$KERNEL_PKG" "$old"; then
        say "removing the stale image $d"
        rm -rf --one-file-system "$d"
    fi
done
say "built $OUT in $(($(date +%s) - START)) s"
echo "$OUT"
