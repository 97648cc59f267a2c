#!/usr/bin/env bash
# Before a GPU window, on a CPU machine with the checkout and the built bundle: the dry run of scripts/gpu_window.py
# (the bundle's checksums and restore, every kernel patch applied and checked in Triton's interpreter, every spec
# loaded), then the GPU host's plan with the seconds each step is expected to take. The kernel checks need torch and
# triton: the CPU set-up's venv (./setup.sh makes .venv), or PY=... another; without it the bundle's small venv runs
# the other checks and the dry run fails, saying the kernels were not checked.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
if [ -z "${PY:-}" ]; then
  PY=.venv/bin/python
  [ -x "$PY" ] || PY=.whl/venv/bin/python
fi
step "dry run" env PYTHONPATH="$PWD" nice -n 10 "$PY" scripts/gpu_window.py dry-run "$@"
"$PY" scripts/gpu_window.py plan
