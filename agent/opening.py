"""How every campaign begins, whatever its target (serving: campaign.py; kernel: kernel_campaign.py): its id,
the audit log, the workspace and its branch, the gate, and the `campaign.start` record with the fields a
resume, a replay and a reviewer read. The target adds its own fields to that record."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent import records
from agent.environment import describe_environment
from agent.fresh_host import checkout_roots
from agent.gatekeeper import Gatekeeper
from agent.host import HostProbe, probe_host
from agent.target import target_record
from audit import AuditWriter
from policies import load_policy
from sandbox.workspace import PackageSource, Workspace

__all__ = ["Opened", "file_sha256", "new_campaign_id", "open_campaign"]


def new_campaign_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:   # streamed: weights and result files can be large
        return hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass(frozen=True)
class Opened:
    campaign_id: str
    log_dir: Path
    writer: AuditWriter
    workspace: Workspace
    branch: str
    gate: Gatekeeper


@contextmanager
def open_campaign(*, spec: BaseModel, spec_path: Path, name: str, policy_path: Path, log_root: Path,
                  workspace_dir: Path | None, workspace_root: Path, package: str,
                  source: Path | PackageSource | None,
                  serving: Mapping[str, object], limits: Mapping[str, float], proposer: str,
                  header: Mapping[str, str] | None = None,
                  start: Callable[[Workspace], Mapping[str, Any]] | None = None,
                  probe: HostProbe = probe_host) -> Iterator[Opened]:
    """Open the log, create the workspace on branch ratchet/<id>, and record campaign.start (`start`: the
    target's own fields, read off the new workspace) before anything of the target runs. The writer closes
    when the block ends. `workspace_dir`: the spec's fixed folder, else <workspace_root>/<id>. A `source` that is
    not a folder here (a Docker image's package) is recorded as `target_image`. What a resume on another host
    reads is recorded too (agent/fresh_host.py): the host (`probe`), the checkouts the spec's paths lie in, and
    the base commit's raw object (with each accepted commit's, the branch can be written again, same hashes)."""
    campaign_id = new_campaign_id(name)
    log_dir = (log_root / campaign_id).resolve()
    policy = load_policy(policy_path)
    with AuditWriter.open(log_dir, campaign=campaign_id, header=dict(header) if header else None) as writer:
        ws = Workspace.create((workspace_dir or workspace_root / campaign_id).resolve(), serving=dict(serving),
                              package=package, source=source)
        branch = f"ratchet/{campaign_id}"
        ws.repo.git.checkout("-q", "-b", branch)
        gate = Gatekeeper(policy=policy, writer=writer, root=ws.root, limits=dict(limits))
        writer.append(records.CAMPAIGN_START, payload={
            "spec_path": str(spec_path.resolve()), "spec": json.loads(spec.model_dump_json()),
            "workspace": str(ws.root), "branch": branch, "proposer": proposer, "base_commit": ws.head(),
            "base_tree": ws.tree_hash(), "base_commit_object": ws.commit_object(), "host": probe().record(),
            "checkouts": checkout_roots(spec_path), "policy_path": str(policy_path),
            "policy_sha256": gate.policy_sha256,
            "environment": describe_environment(), **target_record(source), **(start(ws) if start else {})})
        yield Opened(campaign_id=campaign_id, log_dir=log_dir, writer=writer, workspace=ws, branch=branch, gate=gate)
