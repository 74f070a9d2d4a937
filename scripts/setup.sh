#!/usr/bin/env bash
# Creates .venv with gleanrl installed (CPU torch pinned so no CUDA build is pulled).
# Usage: bash scripts/setup.sh [--test] [--sglang]
#   --test    also install the test tools (pytest, ruff)
#   --sglang  also install the real SGLang 0.5.23 CPU engine into .venv-sglang (integration tests)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --sglang) want_sglang=1 ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -c scripts/constraints.txt -e ".$extras"
# structured output (the `grammar` extra) without triton, which xgrammar asks for on Linux x86_64
# (~0.9 GB of GPU kernels its CPU path never uses); its other requirements are installed above
.venv/bin/pip install -q --disable-pip-version-check --no-deps -c scripts/constraints.txt \
  xgrammar apache-tvm-ffi
if [ "${want_sglang:-0}" = 1 ]; then
  bash scripts/install_sglang_cpu.sh .venv-sglang || echo "SGLang CPU install failed: the sglang-marked tests will be skipped" >&2
fi
