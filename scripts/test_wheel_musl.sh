#!/usr/bin/env bash
# Tests the x86-64 musllinux_1_2 wheel on musl: a CPython built here against musl (Debian's
# musl-tools), with the wheel and its test dependencies' musllinux wheels installed into a venv,
# and the subset test_wheel_arm64.sh runs (engine, sampler, datasets, the 0.9.11 stores, loader,
# process workers). A release runs it after scripts/build_wheels.py:
#   bash scripts/test_wheel_musl.sh [WHEEL] [pytest arguments]
# WHEEL defaults to dist/'s cp311-abi3 musllinux x86-64 wheel.
#
# The interpreter: Debian bookworm's source packages python3.11 (CPython 3.11.2, the oldest the
# abi3 wheel is for), zlib, libffi, bzip2 and xz-utils, fetched with `apt-get source
# --download-only` through a private sources list (the archive URI this machine's apt already
# uses), the libraries built static and CPython linked against them with musl-gcc (the kernel's
# headers from linux-libc-dev beside musl's own). About 10 minutes on 2 cores, once, into
# $LOADERX_MUSL_CACHE (default ~/.cache/loaderx-musl), built under a temporary directory there
# and renamed into place last. The test dependencies come as musllinux wheels downloaded by the
# host's pip (this interpreter has no ssl); numpy is pinned to 1.26.4, as NumPy 2.4's
# musllinux_1_2 wheel crashes on import under this interpreter (in its own extension's load).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${LOADERX_MUSL_CACHE:-$HOME/.cache/loaderx-musl}"
PREFIX="$CACHE/cpython-3.11"
MPY="$PREFIX/bin/python3.11"
NUMPY="numpy==1.26.4"
# shellcheck source=scripts/_wheel_test_common.sh
source "$ROOT/scripts/_wheel_test_common.sh"

wheel="$(pick_wheel "${1:-}" "loaderx-*-cp311-abi3-musllinux_1_2_x86_64.whl" x86_64-musllinux_1_2)"
[ $# -gt 0 ] && shift
[ "$(uname -m)" = x86_64 ] || die "the musl interpreter is built for this machine: x86-64 only"

# True when the interpreter runs on musl with what pip and the suite need compiled in (its
# complaint on stderr with a second argument).
musl_ok() {
    [ -x "$1" ] && "$1" -c '
import bz2, ctypes, lzma, zlib, sysconfig  # noqa: F401
assert sysconfig.get_config_var("SOABI").endswith("linux-musl")' 2>"${2:-/dev/null}"
}

debian_uri() {  # (a missing file is no error: either format may be absent)
    { cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | awk '$1 == "URIs:" {print $2}'
    { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } \
        | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}'
}

build_interpreter() {
    command -v musl-gcc >/dev/null || die "no musl-gcc: apt-get install musl-tools"
    command -v apt-get >/dev/null || die "no apt-get: the sources are fetched as Debian's source packages"
    [ -d /usr/include/linux ] || die "no kernel headers: apt-get install linux-libc-dev"
    local free_kib uri
    free_kib=$(df -Pk "$CACHE" | awk 'NR == 2 {print $4}')
    [ "$free_kib" -gt $((2 * 1024 * 1024)) ] || die "2 GiB free needed at $CACHE to build CPython"
    uri="${LOADERX_MUSL_APT_URI:-$(debian_uri | grep -v security | head -n 1 || true)}"
    [ -n "$uri" ] || die "no Debian archive URI in /etc/apt (set LOADERX_MUSL_APT_URI)"
    tmp="$CACHE/.build-$$"  # global: the EXIT trap removes it
    rm -rf "$tmp"
    mkdir -p "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/src" "$tmp/deps" \
        "$tmp/kernel"
    trap 'rm -rf "$tmp"' EXIT
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' \
        "$uri" /usr/share/keyrings/debian-archive-keyring.gpg > "$tmp/apt/src.sources"
    local apt=(apt-get -q -o "Dir::Etc::sourcelist=$tmp/apt/src.sources" -o "Dir::Etc::sourceparts=-"
               -o "Dir::State::Lists=$tmp/apt/lists" -o "Dir::Cache=$tmp/apt/cache")
    if [ "$(id -u)" = 0 ]; then apt+=(-o "APT::Sandbox::User=root"); fi
    say "fetching python3.11, zlib, libffi, bzip2 and xz-utils from Debian bookworm's sources ($uri)"
    { "${apt[@]}" update && (cd "$tmp/src" && "${apt[@]}" --download-only source python3.11 zlib \
        libffi bzip2 xz-utils); } > "$tmp/apt.log" 2>&1 \
        || { cat "$tmp/apt.log" >&2; die "apt-get source failed"; }
    local f
    for f in "$tmp"/src/*.orig.tar.*; do
        case "$f" in *.asc) ;; *) tar -C "$tmp/src" -xf "$f" ;; esac
    done
    # musl-gcc leaves /usr/include out (glibc's headers); the kernel's come back, and gcc's own
    # multiarch name (glibc's) is replaced by musl's, which CPython's configure checks against.
    local multiarch
    multiarch=$(gcc -print-multiarch)
    ln -s /usr/include/linux /usr/include/asm-generic "$tmp/kernel/"
    ln -s "/usr/include/$multiarch/asm" "$tmp/kernel/asm"
    cat > "$tmp/cc" <<EOF
#!/bin/sh
for a in "\$@"; do
    case "\$a" in --print-multiarch|-print-multiarch) echo x86_64-linux-musl; exit 0 ;; esac
done
exec musl-gcc -idirafter $tmp/kernel "\$@"
EOF
    chmod +x "$tmp/cc"
    local cc="$tmp/cc" deps="$tmp/deps" jobs
    jobs=$(nproc 2>/dev/null || echo 2)
    say "building the libraries and CPython 3.11 against musl (about 10 minutes; log: $tmp/build.log)"
    build_all() {  # each step on its own line: set -e stops at the first that fails
        set -e
        cd "$tmp"/src/zlib-*/
        CC="$cc" CFLAGS="-O2 -fPIC" ./configure --static --prefix="$deps"  # (PIC: in a module)
        make -j"$jobs" install
        cd "$tmp"/src/libffi-*/
        CC="$cc" ./configure --prefix="$deps" --disable-shared --with-pic --disable-docs
        make -j"$jobs" install
        cd "$tmp"/src/bzip2-*/
        make -j"$jobs" CC="$cc" CFLAGS="-O2 -fPIC" libbz2.a
        cp libbz2.a "$deps/lib/"
        cp bzlib.h "$deps/include/"
        cd "$tmp"/src/xz-*/
        CC="$cc" ./configure --prefix="$deps" --disable-shared --with-pic --disable-xz \
            --disable-xzdec --disable-lzmadec --disable-lzmainfo --disable-scripts --disable-doc \
            --disable-nls
        make -j"$jobs" install
        cd "$tmp"/src/Python-*/
        CC="$cc" CPPFLAGS="-I$deps/include" LDFLAGS="-L$deps/lib -L$deps/lib64" \
            PKG_CONFIG_LIBDIR="$deps/lib/pkgconfig:$deps/lib64/pkgconfig" \
            ./configure --prefix="$PREFIX" --without-ensurepip
        nice make -j"$jobs"
        make install DESTDIR="$tmp/stage"
    }
    local rc=0
    set +e  # (not `|| ...`: that would switch set -e off inside build_all)
    (build_all) > "$tmp/build.log" 2>&1
    rc=$?
    set -e
    cp "$tmp/build.log" "$CACHE/build.log"
    [ "$rc" = 0 ] || { tail -n 40 "$tmp/build.log" >&2; die "the build failed (the log's end is above; all of it in $CACHE/build.log)"; }
    musl_ok "$tmp/stage$PREFIX/bin/python3.11" /dev/stderr \
        || die "the built interpreter lacks a module (zlib, bz2, lzma, ctypes) or is not on musl (log: $CACHE/build.log)"
    rm -rf "$PREFIX"
    mv "$tmp/stage$PREFIX" "$PREFIX"
    rm -rf "$tmp"
    trap - EXIT
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # one run at a time per cache
rm -rf "$CACHE"/.build-*
musl_ok "$MPY" || build_interpreter

# The venv: pip and the test dependencies from musllinux wheels the host's pip downloads.
want="$("$MPY" -c 'import sys; print(sys.version)') | ${DEPS[*]}"
if [ "$(cat "$CACHE/venv/.deps" 2>/dev/null)" != "$want" ]; then
    say "making the musl venv with ${DEPS[*]} (once)"
    rm -rf "$CACHE/venv" "$CACHE/wheels"
    python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
        --platform musllinux_1_2_x86_64 --platform musllinux_1_1_x86_64 --python-version 3.11 \
        --implementation cp -d "$CACHE/wheels" pip "${DEPS[@]}" \
        || die "the host's pip could not download musllinux wheels of ${DEPS[*]}"
    "$MPY" -m venv --without-pip "$CACHE/venv"
    "$CACHE/venv/bin/python" "$(ls "$CACHE"/wheels/pip-*.whl)/pip" install -q \
        --disable-pip-version-check --no-index --find-links "$CACHE/wheels" pip "${DEPS[@]}" \
        2> >(grep -v "ssl" >&2)
    echo "$want" > "$CACHE/venv/.deps"
fi

run_dir="$(mktemp -d /tmp/loaderx-musl-run.XXXXXX)"
trap 'rm -rf "$run_dir"' EXIT
cp -r tests README.md "$run_dir/"
"$CACHE/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --force-reinstall "$wheel" 2> >(grep -v "ssl" >&2)
[ $# -gt 0 ] || set -- "${SUBSET[@]}"
say "$(basename "$wheel") under CPython $("$MPY" -c 'import platform; print(platform.python_version())') on musl: $*"
start=$(date +%s)
(cd "$run_dir" && "$CACHE/venv/bin/python" -c "
import sysconfig, loaderx._native as n
assert sysconfig.get_config_var('SOABI').endswith('linux-musl')
assert 'site-packages' in n.__file__, n.__file__
print('installed:', n.__file__)" && "$CACHE/venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$@") \
    || die "failed after $(($(date +%s) - start)) s"
say "passed in $(($(date +%s) - start)) s"
