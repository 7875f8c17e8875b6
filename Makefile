# Small named tasks for development. CI runs `bash .ci/run` (= scripts/test.sh), not this file.
.PHONY: demo test fmt lint rust-test py-test bench build wheel

demo:           ## the main job
	bash scripts/demo.sh

test:           ## every check CI runs
	bash scripts/test.sh

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

rust-test:
	cargo test --workspace --exclude loaderx-py

py-test: build
	.venv/bin/python -m pytest -q tests

build:
	.venv/bin/maturin develop --release -q

bench: build    ## all benchmark layers; `make bench LAYER=store` for one
	.venv/bin/python scripts/bench.py $(or $(LAYER),all)

wheel:
	.venv/bin/maturin build --release
