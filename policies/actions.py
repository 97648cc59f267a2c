"""Actions the gate decides, validated from JSON (schema documented in policies/README.md)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from policies.errors import ActionError
from policies.model import Port, Resource, format_validation_error

__all__ = [
    "Action",
    "NetworkRequest",
    "Patch",
    "ReadFile",
    "RunCommand",
    "Spend",
    "StartServer",
    "UseGpu",
    "WriteFile",
    "action_digest",
    "action_json",
    "parse_action",
]


class _Action(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: str | None = None  # the caller's action id (recorded as action_id in the audit log)


class ReadFile(_Action):
    kind: Literal["read_file"]
    path: str


class WriteFile(_Action):
    kind: Literal["write_file"]
    path: str
    content: str | None = None  # when given, content rules apply to every line


class Patch(_Action):
    kind: Literal["patch"]
    diff: str = Field(min_length=1)  # a git-style unified diff, paths prefixed a/ and b/


class RunCommand(_Action):
    kind: Literal["run_command"]
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)  # variables set on top of a clean environment


class StartServer(_Action):
    kind: Literal["start_server"]
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: Port


class UseGpu(_Action):
    kind: Literal["use_gpu"]
    devices: int = Field(ge=1)
    minutes: float = Field(gt=0)


class NetworkRequest(_Action):
    kind: Literal["network"]
    host: str = Field(min_length=1)
    port: Port


class Spend(_Action):
    kind: Literal["spend"]
    resource: Resource
    amount: float = Field(ge=0)


Action = Annotated[
    ReadFile | WriteFile | Patch | RunCommand | StartServer | UseGpu | NetworkRequest | Spend,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[Action] = TypeAdapter(Action)


def parse_action(data: str | bytes | dict[str, object], *, where: str = "<action>") -> Action:
    """Validate an action from JSON text or a decoded object; raise ActionError with the field path."""
    try:
        if isinstance(data, dict):
            return _ADAPTER.validate_python(data)
        return _ADAPTER.validate_json(data)
    except ValidationError as error:
        raise ActionError(format_validation_error(where, error)) from None


def action_json(action: Action) -> dict[str, Any]:
    return action.model_dump(mode="json")


def action_digest(action: Action) -> str:
    """sha256 over the canonical JSON of the validated action without its `id`: what an approvals
    file lists (the same action approved once is approved whatever id the loop gives it)."""
    return hashlib.sha256(rfc8785.dumps(action.model_dump(mode="json", exclude={"id"}))).hexdigest()
