#!/usr/bin/env bash
# Tests the aarch64 (manylinux2014) wheel on arm64 under emulation: an arm64 Debian root made
# with debootstrap from Debian's packages, run through qemu-user-static (binfmt_misc), with the
# wheel installed into a virtual environment there and a subset of the suite run against it
# (the engine, the sampler, the datasets, the loader with threads and with process workers, and
# the stores loaderx 0.9.11 wrote). A release runs it after scripts/build_wheels.py:
#   bash scripts/test_wheel_arm64.sh [WHEEL] [pytest arguments]   # as root (chroot, mounts)
# WHEEL defaults to dist/'s cp311-abi3 aarch64 manylinux wheel. Without pytest arguments the
# subset below runs: 330 tests, about 12 minutes emulated on 2 shared cores.
#
# Needs, on a Debian host: qemu-user-static, binfmt-support and debootstrap (apt-get install
# qemu-user-static binfmt-support debootstrap); the run says which is missing. The root (Debian
# bookworm, python3 3.11: the oldest CPython the abi3 wheel is for) and its venv with numpy,
# msgpack, pytest and hypothesis are made once into $LOADERX_ARM64_CACHE (default
# ~/.cache/loaderx-arm64); the root is built beside its final place and renamed in when complete.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${LOADERX_ARM64_CACHE:-$HOME/.cache/loaderx-arm64}"
SUITE="${LOADERX_ARM64_SUITE:-bookworm}"
CHROOT="$CACHE/$SUITE"
NUMPY="numpy>=1.24"
# shellcheck source=scripts/_wheel_test_common.sh
source "$ROOT/scripts/_wheel_test_common.sh"

[ "$(id -u)" = 0 ] || die "needs root: it runs chroot and mounts /proc and /dev into the arm64 root"
wheel="$(pick_wheel "${1:-}" "loaderx-*-cp311-abi3-*manylinux_2_17_aarch64*.whl" aarch64-manylinux2014)"
[ $# -gt 0 ] && shift
case "$(basename "$wheel")" in *aarch64*) ;; *) die "$wheel is not an aarch64 wheel" ;; esac

# qemu through binfmt_misc: the kernel runs arm64 ELF files with qemu-aarch64 (flag F: the
# interpreter is opened once, so the chroot need not contain it).
command -v qemu-aarch64-static >/dev/null \
    || die "no qemu-aarch64-static: apt-get install qemu-user-static binfmt-support"
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null \
        || die "binfmt_misc is not mounted and cannot be (mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc)"
fi
if ! grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
    command -v update-binfmts >/dev/null || die "no update-binfmts: apt-get install binfmt-support"
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 \
        || die "cannot register qemu-aarch64 with binfmt_misc (update-binfmts --enable qemu-aarch64)"
fi

# The Debian archive this machine's apt already uses (deb822 or one-line format).
debian_uri() {  # (a missing file is no error: either format may be absent)
    { cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | awk '$1 == "URIs:" {print $2}'
    { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } \
        | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}'
}

make_root() {
    command -v debootstrap >/dev/null || die "no debootstrap: apt-get install debootstrap"
    local free_kib uri
    mkdir -p "$CACHE"
    free_kib=$(df -Pk "$CACHE" | awk 'NR == 2 {print $4}')
    [ "$free_kib" -gt $((2 * 1024 * 1024)) ] || die "2 GiB free needed at $CACHE for the arm64 root"
    uri="${LOADERX_ARM64_APT_URI:-$(debian_uri | grep -v security | head -n 1 || true)}"
    [ -n "$uri" ] || die "no Debian archive URI in /etc/apt (set LOADERX_ARM64_APT_URI)"
    new="$CACHE/.new-$SUITE-$$"  # global: the EXIT trap removes it
    rm -rf "$new"
    trap 'rm -rf "$new"' EXIT
    say "making an arm64 Debian $SUITE root with debootstrap from $uri (once, ~10 minutes)"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$new" "$uri" > "$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
    rm -rf "$CHROOT"
    mv "$new" "$CHROOT"
    trap - EXIT
}

exec 9>"$CACHE.lock"
flock 9  # one run at a time per cache: runs share the root's mounts and venv
rm -rf "$CACHE"/.new-*
[ -x "$CHROOT/usr/bin/python3" ] || make_root

mounted=()
run_dir="/tmp/loaderx-arm64-run-$$"
cleanup() {
    local m
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        # (an rbind can leave its base behind after one pass: unmount until nothing is there)
        while mountpoint -q "${mounted[i]}"; do umount -R "${mounted[i]}" 2>/dev/null || break; done
    done
    rm -rf "${CHROOT:?}$run_dir"
}
trap cleanup EXIT
for m in proc dev; do
    mountpoint -q "$CHROOT/$m" && continue
    if [ "$m" = proc ]; then mount -t proc proc "$CHROOT/proc"; else mount --rbind /dev "$CHROOT/dev" && mount --make-rslave "$CHROOT/dev"; fi
    mounted+=("$CHROOT/$m")
done
# pip in the root reaches the package index as the host's pip does: the host's resolver, pip
# configuration and certificate authorities (a proxy's own CA among them), and its PIP_* and
# proxy variables.
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$CHROOT/etc/pip.conf"
root_env=(HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8)
ca="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
if [ -f "$ca" ]; then
    cp "$ca" "$CHROOT/etc/loaderx-host-ca.pem"
    root_env+=(PIP_CERT=/etc/loaderx-host-ca.pem SSL_CERT_FILE=/etc/loaderx-host-ca.pem)
fi
while IFS= read -r var; do
    root_env+=("$var=${!var}")
done < <(compgen -e | grep -E '^(PIP_(INDEX_URL|EXTRA_INDEX_URL|TRUSTED_HOST|DEFAULT_TIMEOUT)|(https?|no)_proxy|(HTTPS?|NO)_PROXY)$' || true)
in_root() { chroot "$CHROOT" /usr/bin/env -i "${root_env[@]}" "$@"; }

want="$(in_root python3 -c 'import sys; print(sys.version)') | ${DEPS[*]}"
if [ "$(cat "$CHROOT/opt/venv/.deps" 2>/dev/null)" != "$want" ]; then
    say "making the arm64 venv with ${DEPS[*]} (once)"
    rm -rf "$CHROOT/opt/venv"
    in_root python3 -m venv /opt/venv
    in_root /opt/venv/bin/pip install -q --disable-pip-version-check "${DEPS[@]}" \
        || die "pip in the arm64 root could not install ${DEPS[*]}"
    echo "$want" > "$CHROOT/opt/venv/.deps"
fi

mkdir -p "$CHROOT$run_dir"
cp "$wheel" "$CHROOT$run_dir/"
cp -r tests README.md "$CHROOT$run_dir/"
in_root /opt/venv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall \
    "$run_dir/$(basename "$wheel")"
[ $# -gt 0 ] || set -- "${SUBSET[@]}"
say "$(basename "$wheel") on $(in_root uname -m) (emulated), $(in_root python3 -V): $*"
start=$(date +%s)
in_root /bin/sh -c 'cd "$1" && shift && /opt/venv/bin/python -c "
import platform, loaderx._native as n
assert platform.machine() == \"aarch64\", platform.machine()
assert \"site-packages\" in n.__file__, n.__file__
print(\"installed:\", n.__file__, platform.machine())" && exec /opt/venv/bin/python -m pytest -q -rs -p no:cacheprovider "$@"' \
    sh "$run_dir" "$@" || die "failed after $(($(date +%s) - start)) s"
say "passed in $(($(date +%s) - start)) s"
