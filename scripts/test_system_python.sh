#!/usr/bin/env bash
# The suite under the distribution's own interpreter: Debian 12's python3 is CPython 3.11.2, the
# oldest release `requires-python = ">=3.11"` admits as a distribution ships it (its threading
# and multiprocessing lack what later 3.11 releases added). Run by test.sh after the main suite,
# so the native module (abi3: one build serves every interpreter >= 3.11) is already built.
#   bash scripts/test_system_python.sh [pytest arguments]     # default: the suite below
# What runs: every test but the framework ones (torch, JAX and Orbax need 6 GB of wheels in a
# second environment; they run under the project's interpreter). SYSTEM_PYTHON picks another
# interpreter; where none is found the leg says so and fails under CI=true.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SPY="${SYSTEM_PYTHON:-/usr/bin/python3}"
if [ ! -x "$SPY" ]; then
    echo "test_system_python.sh: no interpreter at $SPY (set SYSTEM_PYTHON)" >&2
    if [ "${CI:-}" = true ]; then exit 1; fi
    exit 0
fi
if ! "$SPY" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "test_system_python.sh: $SPY is older than 3.11 or has no venv/ensurepip" \
         "(Debian: apt-get install python3-venv)" >&2
    exit 1
fi
if [ ! -e python/loaderx/_native.abi3.so ]; then
    echo "test_system_python.sh: the native module is not built; run scripts/env.sh first" >&2
    exit 1
fi
VENV="$ROOT/.venv-system"
stamp="$VENV/.deps-installed"
deps=("numpy>=1.24" "msgpack>=1.0" "pytest>=7" "hypothesis>=6" "Pillow>=9" "pyarrow>=18"
      "pandas>=2" "polars>=1" "dask>=2024.1" "distributed>=2024.1" "braceexpand>=0.1"
      "webdataset>=0.2")
want="$("$SPY" -c 'import sys; print(sys.version)')"
# The stamp is written last: a venv without it (a cut install) or made by another interpreter
# is made again.
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    rm -rf "$VENV"
    "$SPY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${deps[@]}"
    # The checkout's package (and its native module) on the path, as `maturin develop` does.
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    echo "$ROOT/python" > "$site/loaderx-checkout.pth"
    # ... and its console script, as pip writes it for [project.scripts].
    printf '#!%s\nimport sys\nfrom loaderx.cli import main\nsys.exit(main())\n' \
        "$VENV/bin/python" > "$VENV/bin/loaderx"
    chmod +x "$VENV/bin/loaderx"
    echo "$want" > "$stamp"
fi
"$VENV/bin/python" -c 'import sys, loaderx._native; print("system interpreter:", sys.version.split()[0], loaderx._native.__file__)'
if [ $# -eq 0 ]; then
    set -- tests --ignore=tests/test_frameworks.py --ignore=tests/test_torch_distributed.py \
        --ignore=tests/test_jax_distributed.py --ignore=tests/test_augment_torchvision.py
fi
# CI unset for this leg alone: the framework checks inside other files skip here (they ran above).
env -u CI "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
