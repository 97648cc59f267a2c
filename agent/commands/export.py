"""`ratchet export mlflow DIR`: a verified campaign log as one MLflow run (audit/export_mlflow.py).

Exit codes: 0 exported (prints the run id and tracking URI), 1 the log does not verify (nothing exported),
2 unusable input (MLflow not installed, already exported without --replace, a tracking store MLflow refuses),
4 a --policy/--pubkey file cannot be loaded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from agent.commands.audit import _verify_flags, _verify_result
from audit import write_report
from audit.export_mlflow import ExportError, export_mlflow
from policies import PolicyError

__all__ = ["register"]


def _mlflow(args: argparse.Namespace) -> int:
    if not (args.dir / "log.jsonl").is_file():
        print(f"ratchet export mlflow: no log.jsonl in {args.dir}", file=sys.stderr)
        return 2
    try:
        result = _verify_result(args)
    except PolicyError as error:
        print(f"ratchet export mlflow: {error}", file=sys.stderr)
        return 4
    if not result.ok:
        print(f"ratchet export mlflow: the log does not verify ({result.summary()}): nothing exported",
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="ratchet-export-") as tmp:
        # the report as of this verification (the one in the log folder may be older, or absent)
        write_report(args.dir, out_dir=Path(tmp), verification=result)
        try:
            run_id, uri = export_mlflow(args.dir, verification=result, tracking_uri=args.tracking_uri,
                                        experiment=args.experiment, replace=args.replace, report_dir=Path(tmp))
        except ExportError as error:
            print(f"ratchet export mlflow: {error}", file=sys.stderr)
            return 2
        except Exception as error:  # MLflow's own errors (unreachable server, refused store) name the cause
            print(f"ratchet export mlflow: MLflow refused the export: {type(error).__name__}: {error}",
                  file=sys.stderr)
            return 2
    print(f"{result.summary()}\nexported as MLflow run {run_id} (experiment {args.experiment!r}, tracking URI {uri})")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("export", help="export a campaign to experiment trackers (MLflow)")
    sub = parser.add_subparsers(dest="export_command", required=True, metavar="TARGET")
    p = sub.add_parser("mlflow", help="one MLflow run per campaign: params, per-iteration metrics, artifacts")
    _verify_flags(p)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (file:, sqlite:, http(s)://); default: MLflow's "
                   "own (MLFLOW_TRACKING_URI, else its local default)")
    p.add_argument("--experiment", default="ratchet", help="MLflow experiment name (created if missing)")
    p.add_argument("--replace", action="store_true", help="replace this campaign's earlier run in the experiment")
    p.set_defaults(func=_mlflow)
