#!/usr/bin/env bash
# Serve a small real coding model on loopback for `ratchet run --proposer llm` (foreground; Ctrl-C stops it):
#   bash scripts/llm-server.sh [qwen-coder|smollm2] [PORT]
# qwen-coder (the default): Qwen2.5-Coder-1.5B-Instruct with the GGUF's own chat template, which writes its
# tool calls as <tool_call>{...}</tool_call> text that the proposer parses (proposer.llm.parse_text_tool_calls);
# 16k tokens of context. smollm2: SmolLM2-135M-Instruct under chatml-function-calling, 4k context.
# The model alias is what a spec's proposer.llm.model names (experiments/gemma4-tiny-cpu.yaml: qwen2.5-coder-1.5b).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHICH="${1:-qwen-coder}"
PORT="${2:-8080}"
values="$(bash "$ROOT/scripts/setup-llm-demo.sh" "$WHICH")"
PYTHON="$(sed -n 's/^LLM_DEMO_PYTHON=//p' <<<"$values")"
MODEL="$(sed -n 's/^LLM_DEMO_MODEL=//p' <<<"$values")"
case "$WHICH" in
  qwen-coder) args=(--model_alias qwen2.5-coder-1.5b --n_ctx 16384) ;;
  smollm2) args=(--model_alias smollm2-135m --chat_format chatml-function-calling --n_ctx 4096) ;;
esac
THREADS="${LLM_THREADS:-$(nproc)}"
echo "llm-server: $MODEL on http://127.0.0.1:$PORT/v1 ($THREADS threads)" >&2
exec "$PYTHON" -m llama_cpp.server --model "$MODEL" "${args[@]}" --host 127.0.0.1 --port "$PORT" \
  --n_threads "$THREADS" --n_threads_batch "$THREADS"
