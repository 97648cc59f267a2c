"""What `ratchet resume DIR` needs from outside the campaign's folder, checked before anything is written, so that a
campaign goes on from its folder alone on another host (a spot instance's replacement, the next booking):

    the signing key     the key that signed the log ($RATCHET_AUDIT_KEY, else ~/.config/ratchet/audit-key.ed25519),
                        carried by the user: a new key is never made for an existing log. Its head anchor (beside it,
                        anchors/<campaign>.json) is used when carried too; a host without it resumes without the
                        truncation check the anchor gives, and says so in its campaign.host record
    the host            the same accelerator model and the same software versions (agent/host.py), else refused
    the checkouts       the spec's paths (prompts, models, the policy, a source tree) recorded under the checkouts
                        they lay in (ratchet's, and the spec file's): moved under this host's checkouts
    the inputs          every path the spec reads, present; the parity checkpoint the same weights, by the hash its
                        reference was recorded from (a missing one named with the command that makes it)
    the workspace       rebuilt from the log where it is missing (agent/rebuild.py)

The folder itself holds the rest: the log (spec, accepted diffs and commits, budgets spent), its blobs, the parity
reference, the recorded hashes. `runs/` (server logs, a killed run's trees) and `cache/` need not be carried.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import CampaignError
from agent.host import Host, HostProbe, differences, host_of_start
from agent.journal import Journal, ended_on_wall_budget
from audit import anchor_path, default_anchor_dir, default_key_path
from audit.errors import AuditKeyError
from audit.keys import PUBKEY_NAME, key_id, load_public_key
from harness.integrity import MeasurementDigest

__all__ = ["Arrival", "arrive", "check_inputs", "check_measurement", "check_parity_checkpoint", "checkout_roots",
           "checkpoint_digest", "continuation", "measurement_parts", "recipe_of", "resumed_limits", "RATCHET_ROOT"]

RATCHET_ROOT = Path(__file__).resolve().parents[1]   # the checkout (or copy) ratchet runs from
_HARNESS = RATCHET_ROOT / "harness"


def checkout_roots(spec_path: Path) -> dict[str, str]:
    """The checkouts a spec's paths are recorded under: ratchet's own, and the one holding the spec file (ratchet's
    when the spec lies in it; else its git work tree; else its folder)."""
    spec_dir = spec_path.resolve().parent
    if spec_dir.is_relative_to(RATCHET_ROOT):
        return {"ratchet": str(RATCHET_ROOT), "spec": str(RATCHET_ROOT)}
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=spec_dir, capture_output=True, text=True,
                             timeout=30)
        spec_root = Path(top.stdout.strip()) if top.returncode == 0 and top.stdout.strip() else spec_dir
    except OSError:
        spec_root = spec_dir
    return {"ratchet": str(RATCHET_ROOT), "spec": str(spec_root.resolve())}


def checkpoint_digest(model: Path) -> dict[str, str]:
    """sha256 of each weight file of a checkpoint directory (streamed: weights can be gigabytes)."""
    out = {}
    for f in sorted(model.resolve().glob("*.safetensors")):
        with f.open("rb") as fh:
            out[f.name] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


def recipe_of(model: Path) -> str:
    """The command that makes a checkpoint, as its README says (the first line of the first code block under a
    heading about making it); "" when it says none."""
    try:
        text = (model / "README.md").read_text()
    except OSError:
        return ""
    match = re.search(r"^#+ [^\n]*(?:make|retrain|regenerate|rebuild)[^\n]*\n+```[^\n]*\n([^\n]+)", text,
                      re.IGNORECASE | re.MULTILINE)
    return match.group(1).strip() if match else ""


def measurement_parts(digest: MeasurementDigest) -> dict[str, str]:
    """The measurement path's digest in two parts: the harness by content and by its path inside the harness (the
    same code, wherever the checkout lies), and the rest (interpreter, site-packages: paths, sizes, inodes)."""
    harness, rest = hashlib.sha256(), hashlib.sha256()
    for name in sorted(digest.files):
        path = Path(name)
        if path.is_relative_to(_HARNESS):
            harness.update(path.relative_to(_HARNESS).as_posix().encode() + b"\0" + digest.files[name].encode() + b"\0")
        else:
            rest.update(name.encode() + b"\0" + digest.files[name].encode() + b"\0")
    return {"harness": harness.hexdigest(), "interpreter": rest.hexdigest()}


def check_measurement(start: Mapping[str, Any], digest: MeasurementDigest, *, same_machine: bool) -> None:
    """The measurement path must be the one the campaign began with. On the machine it ran on, to the byte, but for
    where the checkout lies (a candidate that could write there may have changed it before the kill). On another
    machine the interpreter is another install, which no candidate ever ran beside: its versions are the host's
    (agent/host.py), and the harness must be the same code."""
    recorded = start.get("measurement_sha256")
    if not recorded or recorded == digest.sha256:
        return
    parts, here = start.get("measurement_parts"), measurement_parts(digest)
    reinstall = ("the measurement path (pristine client, harness, interpreter) differs from when the campaign "
                 "began: its figures would not be comparable; reinstall the environment the campaign started in, or "
                 "start a new campaign")
    if not isinstance(parts, Mapping):
        raise CampaignError(reinstall)
    if parts.get("harness") != here["harness"]:
        commit = (start.get("environment") or {}).get("ratchet_commit") or "the commit it began with"
        raise CampaignError("the harness differs from the one the campaign began with (another ratchet commit?): its "
                            f"figures would not be comparable; check out ratchet at {commit}, or start a new campaign")
    if same_machine and parts.get("interpreter") != here["interpreter"]:
        raise CampaignError(reinstall)


@dataclass(frozen=True)
class Arrival:
    """A resumable campaign as this host sees it."""

    spec: dict[str, Any]            # the recorded spec, its paths moved under this host's checkouts
    spec_path: Path
    workspace: Path                 # where its workspace is, or is rebuilt
    host: Host                      # this host
    same_machine: bool              # the machine the log last ran on (unknown for a log without a host: True)
    record: dict[str, Any] | None   # the campaign.host payload, when the machine is another


def _move(value: Any, pairs: list[tuple[Path, Path]]) -> Any:
    if isinstance(value, dict):
        return {k: _move(v, pairs) for k, v in value.items()}
    if isinstance(value, list):
        return [_move(v, pairs) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        path = Path(value)
        for old, new in pairs:
            if path.is_relative_to(old):
                return str(new / path.relative_to(old))
    return value


def _checkouts(start: Mapping[str, Any], checkout: Path | None) -> tuple[dict[str, str], list[tuple[Path, Path]]]:
    """This host's checkouts, and (recorded, here) pairs for the ones at another path, the deepest first."""
    recorded = {k: str(v) for k, v in (start.get("checkouts") or {}).items()}
    here = {"ratchet": str(RATCHET_ROOT)}
    if "spec" in recorded:
        here["spec"] = str(checkout.resolve()) if checkout else (
            str(RATCHET_ROOT) if recorded["spec"] == recorded.get("ratchet") else recorded["spec"])
    pairs = sorted({(Path(recorded[k]), Path(here[k])) for k in recorded if k in here and recorded[k] != here[k]},
                   key=lambda pair: -len(pair[0].parts))
    return here, pairs


def signing_key(log_dir: Path, campaign: str) -> dict[str, Any]:
    """The key that signed the log, on this host; else a CampaignError that says what to carry. Never creates one."""
    key_path, pub = default_key_path(), log_dir / PUBKEY_NAME
    try:
        recorded = key_id(load_public_key(pub)) if pub.is_file() else None
    except AuditKeyError as exc:
        raise CampaignError(f"{pub}: {exc}") from None
    carry = (f"a resumed campaign signs with the key that signed its log (its public half: {pub}"
             + (f", key id {recorded[:16]}" if recorded else "") + "); carry that key file from the host that "
             "started it (there: $RATCHET_AUDIT_KEY, else ~/.config/ratchet/audit-key.ed25519), mode 600, and point "
             "RATCHET_AUDIT_KEY at it. A new key is never made for an existing log")
    if not key_path.is_file():
        raise CampaignError(f"the audit signing key {key_path} is not on this host: {carry}")
    try:
        here = key_id(load_public_key(key_path))
    except AuditKeyError as exc:
        raise CampaignError(f"{exc}; {carry}") from None
    if recorded and here != recorded:
        raise CampaignError(f"the audit signing key {key_path} (key id {here[:16]}) is not the key that signed "
                            f"{log_dir / 'log.jsonl'} (key id {recorded[:16]}): {carry}")
    anchors = default_anchor_dir(key_path)
    if not os.access(anchors if anchors.is_dir() else key_path.parent, os.W_OK):
        raise CampaignError(f"the log's head anchor is written beside the key, in {anchors}, which is not writable "
                            "here: copy the key into a writable folder and point RATCHET_AUDIT_KEY at it there")
    anchor = anchor_path(anchors, campaign)
    return {"key": str(key_path), "key_id": here,
            "anchor": str(anchor) if anchor.exists() else None}


def arrive(log_dir: Path, start: Mapping[str, Any], spec: Mapping[str, Any], *, campaign: str, last_host:
           Mapping[str, Any] | None, spec_path: Path, workspace: Path, probe: HostProbe,
           checkout: Path | None) -> Arrival:
    """Check the key and the host, and move the recorded paths to this host's checkouts; raise CampaignError naming
    what is missing or different. Writes nothing."""
    key = signing_key(log_dir, campaign)
    here = probe()
    different = differences(host_of_start(start), here)
    if different:
        raise CampaignError(f"this host is not the kind the campaign was measured on ({'; '.join(different)}): its "
                            "baseline's and incumbent's figures were measured there, and a candidate measured here "
                            "would not be comparable with them. Resume it on a host like the one recorded, or start "
                            "a new campaign here (`ratchet run`), which measures its own baseline")
    roots, pairs = _checkouts(start, checkout)
    last = Host.from_record(last_host) if last_host else None
    same = last is None or last.same_machine(here)
    moved = {str(old): str(new) for old, new in pairs}
    record = None if same else {
        "host": here.record(), "previous": last.label() if last else None, "checkouts": roots, "moved": moved,
        "key": key, "anchor_note": None if key["anchor"] else (
            "no head anchor beside the key on this host: the resume could not check that the log was not cut short "
            "before it was carried here (carry anchors/<campaign>.json beside the key to keep that check)")}
    return Arrival(spec=_move(dict(spec), pairs), spec_path=Path(_move(str(spec_path), pairs)),
                   workspace=Path(_move(str(workspace), pairs)), host=here, same_machine=same, record=record)


def missing_inputs(spec: Mapping[str, Any], fields: tuple[str, ...]) -> list[str]:
    """The spec's input paths (dotted field names; a list field: each item) that are not on this host."""
    out = []
    for name in fields:
        value: Any = spec
        for part in name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not Path(item).exists():
                out.append(f"{name}: {item}")
    return out


def check_inputs(spec: Mapping[str, Any], fields: tuple[str, ...], moved: Mapping[str, str]) -> None:
    missing = missing_inputs(spec, fields)
    if missing:
        where = ("; the recorded checkouts map here as " + ", ".join(f"{a} -> {b}" for a, b in moved.items())
                 if moved else "")
        raise CampaignError(f"the campaign's spec reads files this host does not have: {'; '.join(missing)}{where}. "
                            "Check out the same ratchet commit (and the spec's own checkout: `ratchet resume DIR "
                            "--checkout PATH` says where it is), or put them there")


def check_parity_checkpoint(baseline: Mapping[str, Any] | None, model: Path) -> None:
    """The parity checkpoint must hold the weights its reference was recorded from (their hashes are in the
    baseline record); a missing or other one is named with the command that makes it."""
    recorded = (baseline or {}).get("parity_checkpoint")
    if not recorded:
        return
    here = checkpoint_digest(model) if model.is_dir() else {}
    if here == recorded:
        return
    what = "has no weights" if not here else "holds other weights (" + ", ".join(
        f"{name} {here.get(name, 'absent')[:12]}, recorded {digest[:12]}" for name, digest in recorded.items()) + ")"
    recipe = str((baseline or {}).get("parity_checkpoint_recipe") or recipe_of(model))
    raise CampaignError(f"the parity checkpoint {model} {what}: the campaign's parity reference was recorded from "
                        f"weights with sha256 {recorded}. Carry those weight files from the original host into "
                        f"{model}" + (f", or make them with `{recipe}` (training that is not bit for bit "
                                      "deterministic makes other weights, which are refused the same way)"
                                      if recipe else " (no recipe is recorded for them)"))


def continuation(journal: Journal, wall_seconds: float | None, log_dir: Path) -> bool:
    """Whether this resume continues a campaign that ended (only one whose loop stopped on its wall budget, given a
    new one); a campaign that cannot be resumed is refused with why and what to do instead."""
    if wall_seconds is not None and wall_seconds <= 0:
        raise CampaignError(f"--wall-seconds {wall_seconds:g}: the wall time this run may spend must be above 0")
    if not journal.ended:
        return False
    if ended_on_wall_budget(journal.stop_reason, journal.ended_by):
        if wall_seconds is not None:
            return True
        raise CampaignError(f"campaign {journal.campaign} ended on its wall budget ({journal.stop_reason}); continue "
                            f"it with a new one: `ratchet resume {log_dir} --wall-seconds S`")
    raise CampaignError(f"campaign {journal.campaign} is finished (its campaign.end is recorded: "
                        f"{journal.stop_reason or 'ended'}): nothing to resume; `ratchet audit report {log_dir}` "
                        "shows it, and `ratchet run SPEC` (or `ratchet kernel SPEC`) starts a new one")


def resumed_limits(limits: Mapping[str, float], journal: Journal, wall_seconds: float | None
                   ) -> tuple[dict[str, float], dict[str, Any]]:
    """The budget a resumed run meters (`wall_seconds`: what this run may spend from now on, on top of what the log
    says was spent; none given: the limit an earlier resume was given, else the spec's), and what campaign.resume
    records of it."""
    if wall_seconds is None:
        return ({**limits, "wall_seconds": journal.wall_limit} if journal.wall_limit is not None else dict(limits)), {}
    limit = journal.spent.get("wall_seconds", 0.0) + wall_seconds
    return {**limits, "wall_seconds": limit}, {"wall_seconds_given": wall_seconds, "wall_seconds_limit": limit}
