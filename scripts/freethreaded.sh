#!/usr/bin/env bash
# A free-threaded environment in one command: CPython built with --disable-gil (once, into a cache
# outside the checkout), the project's wheel for it, and .venv-ft with that wheel and the test
# dependencies. Run by test.sh for the free-threaded leg (scripts/test_freethreaded.sh).
#   bash scripts/freethreaded.sh            # prints the interpreter's path last
#
# The interpreter: Debian trixie's source package python3.13 (CPython 3.13.5), fetched with
# `apt-get source --download-only` through a private sources list (a deb-src entry in a file
# of our own under the cache, with the archive URI this machine's apt configuration already
# uses: no system package configuration changes). apt checks the tarball against the signed
# index; the upstream tarball is built as it is (`./configure --disable-gil && make && make
# install`, no Debian patches: those are for Debian's own layout). About 10 minutes on 2 cores,
# once: the prefix is kept in $LOADERX_FT_CACHE (default ~/.cache/loaderx-ft) as the wheelhouse
# is, so a fresh checkout (CI clones afresh every run) reuses it.
#
# Another series is one line below: FT_SERIES=3.14 with FT_SUITE=forky (the Debian suite whose
# source package python3.14 is wanted), or the same as environment variables.
#
# Failure is a message and a non-zero exit, and never a half-made cache entry: the interpreter
# is built and installed under a temporary directory in the cache and renamed into place last;
# the wheelhouse is downloaded beside the old one and swapped in whole; .venv-ft's stamp is
# written last.
set -euo pipefail
: "${FT_SERIES:=${LOADERX_FT_SERIES:-3.13}}" "${FT_SUITE:=${LOADERX_FT_SUITE:-trixie}}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${LOADERX_FT_CACHE:-$HOME/.cache/loaderx-ft}"
PREFIX="$CACHE/cpython-${FT_SERIES}t"
FTPY="$PREFIX/bin/python${FT_SERIES}t"
VENV="$ROOT/.venv-ft"
WHEELS="$CACHE/wheels-${FT_SERIES}t"
# The test dependencies (test_system_python.sh's list, and maturin), each the newest release
# with a wheel for this interpreter (NumPy 2.4 is the last series with cp313t wheels) or built
# here from its sdist; those that cannot be had are left out and their tests skip. hypothesis
# below 6.140: later releases need a Rust extension whose PyO3 refuses 3.13t.
DEPS=("maturin>=1.7,<2" "numpy>=1.24" "msgpack>=1.0" "pytest>=7" "hypothesis>=6,<6.140"
      "braceexpand>=0.1" "webdataset>=0.2" "Pillow>=9" "pyarrow>=18" "pandas>=2" "polars>=1"
      "dask>=2024.1" "distributed>=2024.1" "mypy>=1.10")

say() { echo "freethreaded.sh: $*" >&2; }
die() { say "$*"; exit 1; }

case "$FT_SERIES" in
    3.1[3-9] | 3.[2-9][0-9]) ;;
    *) die "FT_SERIES=$FT_SERIES: free-threaded CPython starts at 3.13 (3.13t, 3.14t)" ;;
esac

# GiB free at PATH, or stop.
need_space() {
    local free_kib
    free_kib=$(df -Pk "$2" | awk 'NR == 2 {print $4}')
    if [ "$free_kib" -lt $(($1 * 1024 * 1024)) ]; then
        die "$1 GiB free needed at $2 ($3), $((free_kib / 1024 / 1024)) GiB free"
    fi
}

# True when PY is a working free-threaded interpreter of this series with what pip and the
# suite need compiled in (ssl, zlib, ctypes, bz2, lzma, sqlite3).
ft_ok() {
    [ -x "$1" ] && "$1" - "$FT_SERIES" <<'EOF' 2>/dev/null
import sys, sysconfig
import bz2, ctypes, lzma, ssl, sqlite3, zlib  # noqa: F401
want = tuple(int(p) for p in sys.argv[1].split("."))
assert sys.version_info[:2] == want, sys.version
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1
assert not sys._is_gil_enabled()
EOF
}

# The URI of the Debian archive this machine's apt already uses (deb822 or one-line format).
debian_uri() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'BEGIN {RS = ""; FS = "\n"}
             {u = ""; s = 0
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); u = a[2] }
                  if ($i ~ /^Suites:/) { n = split($i, b, /[ \t]+/)
                      for (j = 2; j <= n; j++) if (b[j] ~ /^(bookworm|trixie|forky|sid|stable|testing|unstable)$/) s = 1 } }
              if (u != "" && s) { print u; exit }}' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" && $0 ~ /(bookworm|trixie|forky|sid|stable|testing|unstable)( |$)/ {
                 for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' "$f"
    done
}

build_interpreter() {
    command -v apt-get >/dev/null || die "no apt-get: the interpreter is fetched as Debian's source package"
    command -v dpkg >/dev/null || die "no dpkg: the build packages cannot be checked"
    local missing=() p
    for p in build-essential pkg-config libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev \
             libsqlite3-dev; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        die "missing build packages: ${missing[*]} (apt-get install ${missing[*]})"
    fi
    need_space 3 "$CACHE" "building CPython ${FT_SERIES}t"
    local uri
    uri="${LOADERX_FT_APT_URI:-$(debian_uri | head -n 1)}"
    [ -n "$uri" ] || die "no Debian archive URI in /etc/apt (set LOADERX_FT_APT_URI)"
    local tmp="$CACHE/.build-${FT_SERIES}t-$$"
    rm -rf "$tmp"
    mkdir -p "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/src"
    trap 'rm -rf "$tmp"' EXIT
    printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
        "$uri" "$FT_SUITE" /usr/share/keyrings/debian-archive-keyring.gpg > "$tmp/apt/src.sources"
    local apt=(apt-get -q -o "Dir::Etc::sourcelist=$tmp/apt/src.sources" -o "Dir::Etc::sourceparts=-"
               -o "Dir::State::Lists=$tmp/apt/lists" -o "Dir::Cache=$tmp/apt/cache")
    # As root apt drops to its _apt user to download, which cannot write our directory.
    if [ "$(id -u)" = 0 ]; then apt+=(-o "APT::Sandbox::User=root"); fi
    say "fetching python$FT_SERIES from Debian $FT_SUITE's sources ($uri)"
    "${apt[@]}" update >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; die "apt-get update failed"; }
    (cd "$tmp/src" && "${apt[@]}" --download-only source "python$FT_SERIES") >>"$tmp/apt.log" 2>&1 \
        || { cat "$tmp/apt.log" >&2; die "apt-get source python$FT_SERIES failed (is it in $FT_SUITE?)"; }
    local orig
    orig=$(ls "$tmp/src"/python"$FT_SERIES"_*.orig.tar.* 2>/dev/null | head -n 1)
    [ -n "$orig" ] || die "no upstream tarball in the source package"
    tar -C "$tmp/src" -xf "$orig"
    local srcdir
    srcdir=$(find "$tmp/src" -mindepth 1 -maxdepth 1 -type d -name 'Python-*' | head -n 1)
    [ -n "$srcdir" ] || die "the upstream tarball has no Python-* directory"
    say "building $(basename "$srcdir") with --disable-gil (about 10 minutes on 2 cores; log: $tmp/build.log)"
    local jobs
    jobs=$(nproc 2>/dev/null || echo 2)
    (cd "$srcdir" \
        && ./configure -q --disable-gil --prefix="$PREFIX" --with-ensurepip=install \
        && nice make -j"$jobs" -s \
        && make -s install DESTDIR="$tmp/stage") >"$tmp/build.log" 2>&1 \
        || { tail -n 40 "$tmp/build.log" >&2; die "building CPython failed (the log's end is above)"; }
    ft_ok "$tmp/stage$PREFIX/bin/python${FT_SERIES}t" \
        || die "the built interpreter lacks a module (ssl, zlib, ctypes, bz2, lzma, sqlite3) or has the GIL"
    rm -rf "$PREFIX"
    mv "$tmp/stage$PREFIX" "$PREFIX"
    rm -rf "$tmp"
    trap - EXIT
}

mkdir -p "$CACHE"
# One run at a time per cache (two checkouts building at once would share its directories);
# what a killed run left behind goes then.
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
    say "waiting for another run of this script to finish with $CACHE"
    flock 9
fi
rm -rf "$CACHE"/.build-* "$WHEELS".new-* "$WHEELS/.gil-users.new"
if ! ft_ok "$FTPY"; then
    build_interpreter
    ft_ok "$FTPY" || die "$FTPY does not work after its build"
fi

# The wheelhouse: installs with no index, so a fresh checkout downloads nothing. Made once per
# dependency list: each dependency as a wheel for this interpreter (a binary one where the
# registry has one, else built here from its sdist), or left out when that fails and it is not
# required (its tests then skip). A dependency whose extension module turns the GIL back on is
# named and left out the same way, and fails the script when it is required.
kept_deps() {
    local dep
    for dep in "${DEPS[@]}"; do
        if [ ! -f "$WHEELS/.left-out" ] || ! grep -qxF -- "$dep" "$WHEELS/.left-out"; then
            printf '%s\n' "$dep"
        fi
    done
}
install_deps() {
    local deps
    mapfile -t deps < <(kept_deps)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index \
        --find-links "$WHEELS" "${deps[@]}"
}
required() {
    case "$1" in maturin* | numpy* | msgpack* | pytest* | hypothesis*) return 0 ;; esac
    return 1
}
want="$("$FTPY" -c 'import sys; print(sys.version)') | ${DEPS[*]}"
stamp="$VENV/.deps-installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    rm -rf "$VENV"
    "$FTPY" -m venv "$VENV"
    if [ ! -f "$WHEELS/.deps" ] || [ "$(cat "$WHEELS/.deps")" != "$want" ] \
            || ! install_deps 2>/dev/null; then
        need_space 2 "$CACHE" "the ${FT_SERIES}t wheelhouse"
        fresh="$WHEELS.new-$$"
        rm -rf "$fresh"
        mkdir -p "$fresh"
        trap 'rm -rf "$fresh"' EXIT
        say "collecting the test dependencies' ${FT_SERIES}t wheels into $WHEELS"
        : > "$fresh/.left-out"
        for dep in "${DEPS[@]}"; do
            if ! "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --prefer-binary \
                    -w "$fresh" "$dep" > "$fresh/.log" 2>&1; then
                if required "$dep"; then
                    cat "$fresh/.log" >&2
                    die "no ${FT_SERIES}t wheel of $dep, and it is required"
                fi
                say "no ${FT_SERIES}t wheel of $dep: left out, its tests skip"
                echo "$dep" >> "$fresh/.left-out"
            fi
        done
        rm -f "$fresh/.log"
        echo "$want" > "$fresh/.deps"
        rm -rf "$WHEELS"
        mv "$fresh" "$WHEELS"
        trap - EXIT
    fi
    install_deps
    # Every installed distribution's top-level modules imported, each in a fresh interpreter
    # with PYTHON_GIL unset: those that turn the GIL on are named (once per wheelhouse).
    if [ ! -f "$WHEELS/.gil-users" ]; then
        env -u PYTHON_GIL "$VENV/bin/python" "$ROOT/scripts/ft_gil_users.py" > "$WHEELS/.gil-users.new"
        mv "$WHEELS/.gil-users.new" "$WHEELS/.gil-users"
    fi
    mapfile -t gil_users < "$WHEELS/.gil-users"
    for name in "${gil_users[@]}"; do
        for dep in "${DEPS[@]}"; do
            if [ "$(echo "${dep%%[<>=]*}" | tr 'A-Z_' 'a-z-')" = "$(echo "$name" | tr 'A-Z_' 'a-z-')" ] \
                    && required "$dep"; then
                die "importing $name (a required dependency) turns the GIL on"
            fi
        done
        say "importing $name turns the GIL on: uninstalled from .venv-ft, its tests skip"
        "$VENV/bin/python" -m pip uninstall -q -y "$name"
    done
    echo "$want" > "$stamp"
fi

# The project's wheel for this interpreter, from this checkout. Its own cargo target directory,
# kept in the cache (LOADERX_FT_TARGET to move it): the GIL build's (abi3, in target/release) is
# not rebuilt in turn, and a later run in the same checkout compiles only what changed. One
# directory per checkout (by its path): cargo judges a workspace crate fresh by its sources'
# times against its last build, so a build of another checkout's older sources in the same
# directory would be taken for this one's and a change left out of the wheel. The test hooks and
# benchmark ceilings are built as scripts/env.sh builds them.
checkout_key="$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
target="${LOADERX_FT_TARGET:-$CACHE/target-${FT_SERIES}t-$checkout_key}"
need_space 2 "$CACHE" "the ${FT_SERIES}t wheel's build"
dist="$ROOT/target/ft-wheels"
rm -rf "$dist"
CARGO_TARGET_DIR="$target" nice "$VENV/bin/maturin" build --release -q -i "$FTPY" \
    --no-default-features --features bench,testing -o "$dist" 2>&1 \
    | grep -v "^📦\|^🔗\|^🐍\|^✏️\|^🛠\|^⚠️\|^🍹" || true
wheel=$(ls "$dist"/loaderx-*-cp"${FT_SERIES/./}"t-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || die "maturin built no cp${FT_SERIES/./}t wheel"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
# Importing the module must leave the GIL off (PYTHON_GIL unset: a module that does not declare
# itself free-threading-safe turns it on, with a RuntimeWarning).
env -u PYTHON_GIL "$VENV/bin/python" -W error -c '
import sys, loaderx, loaderx._native
assert not sys._is_gil_enabled(), "importing loaderx re-enabled the GIL"
print("free-threaded:", sys.version.split()[0], loaderx._native.__file__, file=sys.stderr)'
echo "$VENV/bin/python"
