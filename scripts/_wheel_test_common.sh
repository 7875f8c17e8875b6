# Sourced by the emulated and musl wheel tests (test_wheel_arm64.sh, test_wheel_musl.sh): what
# both run, their messages, and the wheel they test. The caller sets NUMPY (its numpy pin).

#: The subset that exercises the engine, the loader, process workers and the compat fixtures.
SUBSET=(tests/test_zrecord.py tests/test_sampler.py tests/test_dataset.py tests/test_fixtures.py
        tests/test_dataloader.py tests/test_process_workers.py)
DEPS=("$NUMPY" "msgpack>=1.0" "pytest>=7" "hypothesis>=6")

say() { echo "$(basename "$0"): $*" >&2; }
die() { say "$*"; exit 1; }

# The wheel to test: "$1" when given, else the newest in dist/ matching the glob "$2" (the
# build_wheels.py target "$3" makes it); stops when there is none.
pick_wheel() {
    local wheel="$1"
    if [ -z "$wheel" ]; then
        # shellcheck disable=SC2086 # the glob is meant to expand
        wheel=$(ls -t dist/$2 2>/dev/null | head -n 1)
        [ -n "$wheel" ] || die "no wheel dist/$2: python3 scripts/build_wheels.py --only $3"
    fi
    [ -f "$wheel" ] || die "$wheel: no such wheel"
    echo "$wheel"
}
