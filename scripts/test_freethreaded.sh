#!/usr/bin/env bash
# The suite under a free-threaded interpreter (CPython 3.13t, built once by
# scripts/freethreaded.sh into ~/.cache/loaderx-ft), with the GIL left off: PYTHON_GIL is unset,
# so anything that turns the GIL back on -- our module or a dependency -- does, and the check at
# the end of the run (tests/conftest.py) fails naming it. Run by test.sh after the main suite.
#   bash scripts/test_freethreaded.sh [pytest arguments]     # default: the suite below
# What does not run here: the framework tests and scripts/frameworks.txt's table sources (the
# pinned torch 2.15.0, Orbax's tensorstore and DuckDB 2.0.1 have no cp313t wheels; they run under
# the project's interpreter), and the tests of a dependency that has no free-threaded wheel or
# turns the GIL on (freethreaded.sh leaves it out of .venv-ft and says so: polars; those tests
# skip).
# LOADERX_FREETHREADED=0 skips the leg (it then says so; under CI=true it still runs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "${LOADERX_FREETHREADED:-1}" = 0 ] && [ "${CI:-}" != true ]; then
    echo "test_freethreaded.sh: LOADERX_FREETHREADED=0, the free-threaded leg is skipped" >&2
    exit 0
fi
FTPY="$(bash "$ROOT/scripts/freethreaded.sh" | tail -n 1)"
if [ $# -eq 0 ]; then
    set -- tests --ignore=tests/test_frameworks.py --ignore=tests/test_torch_distributed.py \
        --ignore=tests/test_jax_distributed.py
fi
# CI unset for this leg alone: the framework checks inside other files skip here (they ran
# under the project's interpreter). LOADERX_EXPECT_FREETHREADED: the GIL check in conftest.py
# is on.
env -u CI -u PYTHON_GIL LOADERX_EXPECT_FREETHREADED=1 "$FTPY" -m pytest -q -p no:cacheprovider "$@"
