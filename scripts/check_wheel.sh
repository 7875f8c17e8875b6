#!/usr/bin/env bash
# Builds the abi3 wheel and the sdist, installs each into a clean virtual environment, and runs
# the test suite against the installed package (the source tree is not on the path): the whole
# suite for the wheel, a smoke subset for the package built from the sdist.
#   bash scripts/check_wheel.sh            # needs Rust, a C compiler and Python >= 3.11
#   bash scripts/check_wheel.sh WHEEL      # the whole suite against a wheel built already (e.g.
#                                          # dist/'s manylinux2014 x86-64 one from build_wheels.py)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
OUT="$(mktemp -d /tmp/loaderx-wheel.XXXXXX)"
mkdir -p "$OUT/dist"
if [ $# -gt 0 ]; then
    [ -f "$1" ] || { echo "check_wheel.sh: $1: no such wheel" >&2; exit 1; }
    cp "$1" "$OUT/dist/"
else
    echo "== building into $OUT/dist"
    if [ ! -x .venv/bin/maturin ]; then "$PY" -m venv .venv && .venv/bin/pip install -q "maturin>=1.7,<2"; fi
    .venv/bin/maturin build --release --out "$OUT/dist" 2>&1 | tail -1
    .venv/bin/maturin sdist --out "$OUT/dist" 2>&1 | tail -1
fi
ls -l "$OUT/dist"

run_suite() {  # kind, package file, pytest arguments...
    local kind="$1" pkg="$2"; shift 2
    "$PY" -m venv "$OUT/venv-$kind"
    # The test dependencies scripts/env.sh installs (the guide's examples and the JPEG-stream
    # tests fail, not skip, without Pillow, pyarrow, pandas and dask), less the build tools.
    "$OUT/venv-$kind/bin/pip" install -q --disable-pip-version-check "$pkg" "pytest>=7" \
        "hypothesis>=6" "Pillow>=9" "pyarrow>=18" "pandas>=2" "polars>=1" "dask>=2024.1" \
        "distributed>=2024.1" "braceexpand>=0.1" "webdataset>=0.2"
    mkdir -p "$OUT/run-$kind"
    # What the tests read besides the package: the README and the guide (their examples and
    # links run), the examples, the scripts and the CI entry point they name.
    cp -r tests scripts README.md docs examples .ci "$OUT/run-$kind/"
    [ -d .cache ] && ln -s "$ROOT/.cache" "$OUT/run-$kind/.cache"
    (cd "$OUT/run-$kind" && "$OUT/venv-$kind/bin/python" -c \
        "import loaderx, loaderx._native as n; assert 'site-packages' in n.__file__, n.__file__; print('installed:', n.__file__)" \
        && "$OUT/venv-$kind/bin/python" -m pytest -q -rs -p no:cacheprovider "$@")
}
echo "== wheel: the whole suite"
run_suite wheel "$(ls "$OUT"/dist/*.whl)" tests
if [ $# -eq 0 ]; then
    echo "== sdist (built from source by pip): smoke tests"
    run_suite sdist "$(ls "$OUT"/dist/*.tar.gz)" tests/test_zrecord.py tests/test_dataset.py tests/test_cli.py
fi
echo "== ok: $OUT"
