# Sourced by demo.sh and test.sh: creates (or reuses) .venv, installs what the project needs and
# builds the native module into it. Needs only Rust, a C compiler and Python >= 3.11.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"
# Always this checkout's environment, even when the caller has another one activated (maturin
# installs into $VIRTUAL_ENV).
export VIRTUAL_ENV="$ROOT/.venv"
export PATH="$ROOT/.venv/bin:$PATH"
unset CONDA_PREFIX PYTHONHOME
stamp=".venv/.deps-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/env.sh -nt "$stamp" ]; then
    "$VPY" -m pip install -q --disable-pip-version-check "maturin>=1.7,<2" "numpy>=1.24" "msgpack>=1.0" \
        "pytest>=7" "hypothesis>=6" "mypy>=1.10" "ruff>=0.6" "Pillow>=9" \
        "pyarrow>=18" "pandas>=2" "polars>=1" "dask>=2024.1" "distributed>=2024.1" \
        "braceexpand>=0.1" "webdataset>=0.2" "pyelftools>=0.31"
    touch "$stamp"
fi
# Incremental: cargo rebuilds only what changed.
"$ROOT/.venv/bin/maturin" develop --release --features bench,testing -q 2>&1 | grep -v "^📦\|^🔗\|^🐍\|^✏️\|^🛠\|^⚠️.*editable" || true
"$VPY" -c "import loaderx._native" 
