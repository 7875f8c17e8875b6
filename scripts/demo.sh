#!/usr/bin/env bash
# The main job: builds loaderx into .venv and runs examples/quickstart.py in a fresh directory.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
"$VPY" "$ROOT/examples/quickstart.py"
