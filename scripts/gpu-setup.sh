#!/usr/bin/env bash
# On an offline GPU host, after scripts/gpu-stage.sh has gathered every part into /var/tmp/ratchet-bundle:
#   1. install the bundle into python3's environment (install_bundle.py: chunk and file sha256 checked, xz unpacked
#      with the stdlib; vLLM 0.26 becomes "the installed vllm" that sandbox/workspace.py copies and the pristine
#      client imports), its carried .deb files to /var/tmp/ratchet-bundle/files
#   2. unpack those into /var/tmp/ratchet-tools (root's, 0755): bubblewrap, ip and iptables for the bwrap sandbox
#      (scripts/gpu-lib.sh points RATCHET_SANDBOX_TOOLS there), and git where the host has none
#   3. make the driver's libraries findable without LD_LIBRARY_PATH (the harness starts servers with a clean env),
#      ratchet importable (a .pth: the client runs `python -I`), write the E2B tokenizer, print versions
#   4. create the E2B workspace (SKIP_WORKSPACE=1: a campaign creates its own)
# Each step prints its seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh
D=/var/tmp/ratchet-bundle
PY=$(command -v python3)

install_bundle() {
  "$PY" "$D/install_bundle.py" install "$D" --work /var/tmp --files-to "$D/files"
}

unpack_tools() {
  command -v dpkg-deb >/dev/null || { echo "dpkg-deb not found: unpack $D/files/*.deb into $GPU_TOOLS by hand"; return 1; }
  rm -rf "$GPU_TOOLS"
  mkdir -m 0755 "$GPU_TOOLS"
  for deb in "$D"/files/*.deb; do dpkg-deb -x "$deb" "$GPU_TOOLS"; done
  chmod -R go-w "$GPU_TOOLS"     # the sandbox runs these as root: sandbox/host_tools.py refuses them otherwise
  export RATCHET_SANDBOX_TOOLS=$GPU_TOOLS
  if ! command -v git >/dev/null; then   # gitpython's workspaces; the bundle's git with its own libraries
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s GIT_EXEC_PATH=%s exec %s "$@"\n' \
      "$GPU_TOOLS/usr/lib/x86_64-linux-gnu:$GPU_TOOLS/lib/x86_64-linux-gnu" "$GPU_TOOLS/usr/lib/git-core" \
      "$GPU_TOOLS/usr/bin/git" > /usr/local/bin/git
    chmod 0755 /usr/local/bin/git
  fi
  git --version
  "$PY" -m sandbox.host_tools --gpus 1 || echo "(the spec's sandbox auto will refuse this host: above, why)"
}

host_paths() {
  if ! ldconfig -p | grep -q 'libcuda.so'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [ -d $d ] && echo $d; done > /etc/ld.so.conf.d/zz-nvidia.conf
    ldconfig
  fi
  ln -sf "$(dirname "$PY")/ninja" /usr/local/bin/ninja   # flashinfer JIT runs ninja; servers get PATH=/usr/local/bin:/usr/bin:/bin
  SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$PWD" > "$SITE/ratchet-local.pth"
  "$PY" experiments/models/gemma4-e2b-dummy/make_e2b_dummy.py
  "$PY" -I -c 'import vllm, torch, transformers, tokenizers, harness; print("vllm", vllm.__version__, vllm.__file__, "torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
}

workspace() {
  "$PY" -c 'from pathlib import Path; from agent.spec import load_spec; from sandbox.workspace import Workspace
s = load_spec(Path("experiments/gemma4-e2b-gpu.yaml")); w = Workspace.create(Path("/var/tmp/ws-e2b"), serving=dict(s.server.engine_args)); print("workspace", w.root, w.head())'
}

step "install the bundle" install_bundle
step "unpack git, bubblewrap, ip, iptables ($GPU_TOOLS)" unpack_tools
step "driver libraries, ratchet's .pth, E2B tokenizer" host_paths
[ -n "${SKIP_WORKSPACE:-}" ] || step "workspace /var/tmp/ws-e2b" workspace
