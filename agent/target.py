"""Where a serving campaign's workspace comes from (`target.kind`), and what is recorded about it.

    vllm-installed   the vllm package of this interpreter (sandbox/workspace.py installed_package_dir)
    vllm-source      `target.source`/vllm, a checkout
    vllm-image       the vllm package of the Docker image the candidate servers run in (`sandbox.image`), copied
                     out of it (sandbox/image_package.py): the overlay then shadows the image's own vLLM whole

Every command that creates a workspace from a spec (run, measure, parity, compare, replay...) asks here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.environment import describe_environment
from agent.spec import CampaignSpec, SpecError
from sandbox.image_package import ImagePackage

__all__ = ["workspace_source", "target_record", "served_environment"]


def workspace_source(spec: CampaignSpec, *, client: Any = None) -> Path | ImagePackage | None:
    """The package to copy into a new workspace: a folder, the image's package (located now), or None (the
    installed one). Raises SpecError (wrong backend) or a SandboxError (no image, no vllm in it)."""
    if spec.target.kind != "vllm-image":
        return spec.target_source()
    if spec.sandbox.backend != "docker":   # load_spec refuses it too; a spec rebuilt from a log comes here directly
        raise SpecError(f"target.kind: vllm-image copies vLLM out of the image the servers run in, so it needs "
                        f"sandbox.backend: docker (this spec's is {spec.sandbox.backend})")
    return ImagePackage.locate(spec.sandbox.image, package=spec.target.package, client=client)


def target_record(source: object) -> dict[str, object]:
    """The campaign.start fields that say where the workspace came from (empty for a folder on this host)."""
    return {"target_image": source.describe()} if isinstance(source, ImagePackage) else {}


def served_environment(target_image: Mapping[str, Any] | None) -> dict[str, object] | None:
    """This host's environment with the versions the servers actually run (the image's vLLM, torch and Python),
    for what the proposer is told; None when the servers run this host's own vLLM."""
    if not target_image:
        return None
    return {**describe_environment(), "vllm": target_image.get("version"), "torch": target_image.get("torch"),
            "python": target_image.get("python_version")}
