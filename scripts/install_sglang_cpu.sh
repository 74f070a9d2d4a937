#!/usr/bin/env bash
# Installs stock SGLang 0.5.23 into a separate virtual environment on a CPU-only x86_64 machine, for
# the integration tests marked `sglang` (serving API, logprobs, weight updates; SD does not run on CPU).
# Usage: bash scripts/install_sglang_cpu.sh VENV_DIR     (about 3 minutes, 3.4 GB)
# Launch by hand: PYTHONPATH=VENV_DIR/shim VENV_DIR/bin/python -m sglang.launch_server --model-path MODEL \
#   --device cpu --host 127.0.0.1 --port PORT --max-total-tokens 8192 --skip-server-warmup
# Always cap the KV pool (--max-total-tokens): without it SGLang takes ~20 GB of RAM on CPU.
set -euo pipefail
V=${1:?usage: install_sglang_cpu.sh VENV_DIR}
here=$(cd "$(dirname "$0")" && pwd)
if [ -x "$V/bin/python" ] && PYTHONPATH="$V/shim" "$V/bin/python" -c 'import sglang; assert sglang.__version__ == "0.5.23"' 2>/dev/null; then
  echo "SGLang 0.5.23 already installed in $V"; exit 0
fi
python3 -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check torch==2.13.0
# --no-deps: sglang's own requirements pull CUDA wheels; the pinned CPU-compatible set is in the file.
"$V/bin/pip" install -q --disable-pip-version-check --no-deps sglang==0.5.23 triton==3.8.0 torchvision==0.28.0 \
  -r "$here/requirements-sglang-cpu.txt"
# torchvision 0.28.0 from PyPI is a CUDA build whose ops cannot load beside CPU torch:
# make its nms/qnms fake registrations conditional so `import torchvision` works.
tv=$("$V/bin/python" -c 'import importlib.util,os;print(os.path.dirname(importlib.util.find_spec("torchvision").origin))')
sed -i 's/^@torch.library.register_fake("torchvision::\(q\?nms\)")/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))/' "$tv/_meta_registrations.py"
# SGLang's RotaryEmbedding imports vllm._custom_ops on an unknown platform; the native forward is
# used on CPU, so a stub module on PYTHONPATH is enough.
mkdir -p "$V/shim/vllm"; : > "$V/shim/vllm/__init__.py"
printf 'def rotary_embedding(*a, **k):\n    raise NotImplementedError("stub: native rotary embedding is used on CPU")\n' > "$V/shim/vllm/_custom_ops.py"
PYTHONPATH="$V/shim" "$V/bin/python" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__)'
