#!/usr/bin/env bash
# Every check that decides whether a change lands: formatting, lints, the Rust tests, type
# checks and the Python tests (which include the compatibility test against loaderx==0.9.11 from PyPI).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
echo "== frameworks for the integration tests (torch, JAX, Orbax; once per .venv)"
bash "$ROOT/scripts/frameworks.sh"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -q -- -D warnings
echo "== cargo test"
cargo test --workspace --exclude loaderx-py -q
echo "== ruff (the package, the tests, the scripts)"
"$ROOT/.venv/bin/ruff" check python tests scripts
echo "== the x86-64 manylinux2014 wheel, built and checked (tag, libraries, no symbol newer than GLIBC_2.17)"
wheel_out="$(mktemp -d /tmp/loaderx-ci-wheel.XXXXXX)"
trap 'rm -rf "$wheel_out"' EXIT  # whatever the run's outcome: the wheel is only checked here
"$PY" "$ROOT/scripts/build_wheels.py" --only x86_64-manylinux2014 --flavour abi3 --no-sdist --out "$wheel_out"
echo "== mypy (the package) and stubtest (loaderx/_native.pyi against the compiled module)"
"$VPY" -m mypy
"$VPY" -m mypy.stubtest loaderx._native
echo "== pytest"
"$VPY" -m pytest -q tests
echo "== pytest under the distribution's python3 (Debian 12: 3.11.2; all but the framework tests)"
bash "$ROOT/scripts/test_system_python.sh"
echo "== pytest under free-threaded CPython 3.13t (built once into ~/.cache/loaderx-ft; all but the framework tests)"
bash "$ROOT/scripts/test_freethreaded.sh"
