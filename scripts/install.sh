#!/usr/bin/env bash
# Create .venv and install draftline with its test tools, the gguf extra (tests/target/test_from_gguf.py) and the
# llama extra (llama.cpp's converter: tests/core/test_gguf.py, the served test in tests/test_pipeline.py).
# torch: the CPU build is pinned first so that pip does not pull a multi-GB CUDA build on a CPU box;
# on a GPU machine, install your CUDA build of torch first (or set DRAFTLINE_TORCH to its spec).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "${DRAFTLINE_TORCH:-torch==2.13.0}"
python -m pip install -q -e '.[dev,gguf,llama]'
# z-lab's own DFlash package, the referee of the evaluate and drafter tests (tests/evaluate/test_referee.py): its
# pins (transformers 5.15, datasets 5.0.1) conflict with ours and its model code needs neither, so no deps.
python -m pip install -q --no-deps dflash==0.1.0
