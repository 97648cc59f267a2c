"""The summary of a kernel campaign: one JSON object and a short markdown table, from the campaign's end
(its baseline.result and final.result payloads) and the verification of its audit log."""

from __future__ import annotations

import json
from typing import Any

from agent.kernel_campaign import KernelEnd
from audit import VerifyResult

__all__ = ["summarize", "render_markdown"]


def _row(name: str, shape: dict[str, Any], before: dict[str, Any], after: dict[str, Any] | None,
         speedup: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"shape": name, **{k: shape[k] for k in ("batch", "q_len", "kv_len", "num_q_heads",
                                                                  "num_kv_heads", "head_dim", "sliding_window")}}
    if shape.get("decodes"):     # a mixed batch (older logs' shapes have no such key)
        row.update(decodes=shape["decodes"], decode_kv_len=shape.get("decode_kv_len") or shape["kv_len"])
    for side, entry in (("before", before), ("after", after)):
        if entry is None:
            continue
        att = entry.get("attainment", {})
        row[f"{side}_median_us"] = entry.get("median_us")
        row[f"{side}_gb_s"] = att.get("achieved_gb_s")
        row[f"{side}_pct_hbm"] = att.get("pct_hbm")
        row[f"{side}_tflop_s"] = att.get("achieved_tflop_s")
        row[f"{side}_pct_bf16_flops"] = att.get("pct_bf16_flops")
        row[f"{side}_checks"] = {"pre": entry["pre"], "post": entry.get("post")}
    if speedup:
        row.update(speedup=speedup["ratio"], ci_low=speedup["low"], ci_high=speedup["high"], pairs=speedup["n"])
    return row


def summarize(end: KernelEnd, verification: VerifyResult) -> dict[str, Any]:
    final, base = end.final, end.baseline
    if final is not None:
        rows = [_row(n, e["shape"], e["before"], e["after"], e["speedup"]) for n, e in final["shapes"].items()]
    else:   # nothing accepted (or no final run): the baseline alone
        rows = [_row(n, e["shape"], e, None, None) for n, e in base["shapes"].items()]
    source = final or base
    return {
        "campaign_id": end.campaign_id, "log_dir": str(end.log_dir), "branch": end.branch,
        "workspace": str(end.workspace), "stop_reason": end.stop_reason, "device": source["device"],
        "roofline": source["roofline"], "roofline_baseline_run": base["roofline"],
        "tunables_before": base["tunables"], "tunables_after": final["tunables_after"] if final else base["tunables"],
        "overall": final["overall"] if final else None, "final_verdict": final and final["reason"],
        "shapes": rows,
        "iterations": [{"iteration": h.iteration, "outcome": h.outcome, "source": h.source, "speedup": h.speedup,
                        "predicted": h.predicted_speedup, "detail": h.detail} for h in end.history],
        "serving": end.serving,
        "audit_verify": {"ok": verification.ok, "summary": verification.summary(), "records": verification.records,
                         "checkpoints": verification.checkpoints, "notes": list(verification.notes)},
    }


def _f(value: Any, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def render_markdown(summary: dict[str, Any]) -> str:
    dev, roof = summary["device"], summary["roofline"] or {}
    lines = [f"# Kernel campaign `{summary['campaign_id']}`", "",
             f"- Device: {dev.get('gpu', dev.get('device'))}, torch {dev.get('torch')}, triton {dev.get('triton')}",
             f"- Measured in the same run: HBM {_f(roof.get('hbm_gb_s'), ',.0f')} GB/s (device-to-device copy, read + "
             f"write), bf16 matmul {_f(roof.get('bf16_tflop_s'), ',.0f')} TFLOP/s",
             f"- Stopped: {summary['stop_reason']}; overall speedup (geo-mean): "
             + (_f(summary['overall']['ratio'], '.3f') + f"x [{summary['overall']['low']:.3f}, "
                f"{summary['overall']['high']:.3f}]" if summary["overall"] else "–"),
             f"- Tunables before: `{summary['tunables_before']}`", f"- Tunables after: `{summary['tunables_after']}`",
             f"- Audit log: {summary['audit_verify']['summary']}", "",
             "| shape | before µs | after µs | speedup [95% CI] | % HBM before | % HBM after | TFLOP/s after |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in summary["shapes"]:
        ci = f"{r['speedup']:.3f}x [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if "speedup" in r else "–"
        lines.append(f"| {r['shape']} | {_f(r.get('before_median_us'), '.1f')} | {_f(r.get('after_median_us'), '.1f')}"
                     f" | {ci} | {_f(r.get('before_pct_hbm'), '.1f')} | {_f(r.get('after_pct_hbm'), '.1f')} | "
                     f"{_f(r.get('after_tflop_s'), '.1f')} |")
    serving = summary.get("serving")
    if serving:
        lines += ["", f"End to end (stock vs best served from the same vLLM tree, {serving['repeats']} interleaved "
                      f"pairs per cell): **{serving['verdict']['status']}**: {serving['verdict']['text']}", "",
                  "| cell | speedup [95% CI] |", "| --- | --- |"]
        lines += [f"| {cell} | {ci['ratio']:.3f}x [{ci['low']:.3f}, {ci['high']:.3f}] |"
                  for cell, ci in serving["cells"].items()]
    lines += ["", "| iteration | outcome | tunables (those not at their value before) | speedup | detail |",
              "| ---: | --- | --- | --- | --- |"]
    for it in summary["iterations"]:
        lines.append(f"| {it['iteration']} | {it['outcome']} | `{_moved(it['source'], summary['tunables_before'])}` | "
                     f"{it['speedup'] or '–'} | {it['detail'][:140].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _moved(source: str, before: dict[str, int]) -> str:
    """A search point as the tunables it sets away from the campaign's starting values (0: vLLM's own choice,
    for tunables a prelude named); another proposer's source as it is."""
    if not source.startswith("kernel-search:"):
        return source
    try:
        point = json.loads(source.removeprefix("kernel-search:"))
    except json.JSONDecodeError:
        return source
    moved = {k: v for k, v in point.items() if v != before.get(k, 0)}
    return json.dumps(moved) if moved else "{} (the starting point)"
