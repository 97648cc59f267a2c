#!/usr/bin/env bash
# On an offline GPU host, after scripts/gpu-stage.sh has gathered all parts: install the bundle into python3's
# environment (vLLM 0.26 becomes "the installed vllm" that sandbox/workspace.py copies and the pristine
# client imports), make ratchet importable (a .pth: the client runs `python -I`), bring git for
# gitpython when absent, write the E2B tokenizer, create the workspace. Prints versions.
set -euo pipefail
cd "$(dirname "$0")/.."
D=/var/tmp/ratchet-bundle
PY=$(command -v python3)
t0=$(date +%s)
"$PY" "$D/install_bundle.py" install "$D" --work /var/tmp
echo "install took $(( $(date +%s) - t0 )) s"
if ! command -v git >/dev/null; then
  dpkg -x .whl/deb/git.deb /var/tmp/gitroot
  printf '#!/bin/sh\nGIT_EXEC_PATH=/var/tmp/gitroot/usr/lib/git-core exec /var/tmp/gitroot/usr/bin/git "$@"\n' > /usr/local/bin/git
  chmod +x /usr/local/bin/git
fi
git --version
if ! ldconfig -p | grep -q 'libcuda.so'; then   # the harness starts servers with a clean env (no LD_LIBRARY_PATH)
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [ -d $d ] && echo $d; done > /etc/ld.so.conf.d/zz-nvidia.conf
  ldconfig
fi
ln -sf "$(dirname "$PY")/ninja" /usr/local/bin/ninja   # flashinfer JIT runs ninja; the harness gives servers PATH=/usr/local/bin:/usr/bin:/bin
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$SITE/ratchet-local.pth"
"$PY" experiments/models/gemma4-e2b-dummy/make_e2b_dummy.py
"$PY" -I -c 'import vllm, torch, transformers, tokenizers, harness; print("vllm", vllm.__version__, vllm.__file__, "torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
if [ -z "${SKIP_WORKSPACE:-}" ]; then   # a campaign (scripts/gpu-campaign.sh) creates its own
"$PY" -c 'from pathlib import Path; from agent.spec import load_spec; from sandbox.workspace import Workspace
s = load_spec(Path("experiments/gemma4-e2b-gpu.yaml")); w = Workspace.create(Path("/var/tmp/ws-e2b"), serving=dict(s.server.engine_args)); print("workspace", w.root, w.head())'
fi
echo "setup took $(( $(date +%s) - t0 )) s"
