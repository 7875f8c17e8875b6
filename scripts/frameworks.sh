#!/usr/bin/env bash
# Installs the frameworks the integration tests run against (scripts/frameworks.txt: torch, JAX
# on the CPU, Orbax) into .venv, once per .venv (stamp .venv/.frameworks-installed). Run by
# test.sh after env.sh; demo.sh does without them.
#
# About 3 GB of wheels and 6 GB installed (torch's PyPI wheel is a CUDA build: its nvidia-*
# wheels are most of it). The wheels are kept in a wheelhouse outside the checkout
# ($LOADERX_WHEELHOUSE, default ~/.cache/loaderx-wheels), so a new checkout -- CI clones afresh
# every run -- installs without downloading: the registry here sends no caching headers, so
# pip's own cache keeps none of them. LOADERX_FRAMEWORKS=0 skips the install (the framework
# tests then skip, except under CI=true, where they fail).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VPY="$ROOT/.venv/bin/python"
REQUIREMENTS="scripts/frameworks.txt"
stamp=".venv/.frameworks-installed"
wheels="${LOADERX_WHEELHOUSE:-$HOME/.cache/loaderx-wheels}"

if [ "${LOADERX_FRAMEWORKS:-1}" = 0 ]; then
    echo "frameworks.sh: LOADERX_FRAMEWORKS=0, torch/JAX/Orbax not installed" >&2
    exit 0
fi
if [ -f "$stamp" ] && [ ! "$REQUIREMENTS" -nt "$stamp" ]; then
    exit 0
fi

# Needs GiB free at PATH, or stops naming what takes the space.
need_space() {
    local free_kib
    free_kib=$(df -Pk "$2" | awk 'NR == 2 {print $4}')
    if [ "$free_kib" -lt $(($1 * 1024 * 1024)) ]; then
        echo "frameworks.sh: $1 GiB free needed at $2 for torch/JAX/Orbax, $((free_kib / 1024 / 1024)) GiB free;" \
             "free space or run with LOADERX_FRAMEWORKS=0 (the framework tests then skip)" >&2
        exit 1
    fi
}

install_from_wheelhouse() {
    "$VPY" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" \
        -r "$REQUIREMENTS"
}

need_space 7 "$ROOT/.venv"
if ! install_from_wheelhouse 2>/dev/null; then
    # A missing wheelhouse, or one for other pins: download a complete one beside it, then
    # replace the old (so old versions do not pile up, and a cut download is never used).
    mkdir -p "$(dirname "$wheels")"
    need_space 10 "$(dirname "$wheels")"
    fresh="$wheels.new-$$"
    rm -rf "$fresh"
    "$VPY" -m pip download -q --disable-pip-version-check -d "$fresh" -r "$REQUIREMENTS"
    rm -rf "$wheels"
    mv "$fresh" "$wheels"
    install_from_wheelhouse
fi
touch "$stamp"
