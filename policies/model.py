"""The policy file schema (pydantic, strict, unknown keys rejected), its loader and its hash."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pathspec
import rfc8785
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.errors import PolicyLoadError

__all__ = [
    "CommandRule",
    "ContentRule",
    "EnvPolicy",
    "GpuLimits",
    "NetworkRule",
    "PathRule",
    "Policy",
    "Resource",
    "ServerRule",
    "format_validation_error",
    "load_policy",
    "parse_policy",
    "policy_sha256",
]

RuleId = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
Effect = Literal["allow", "deny", "ask"]
Resource = Literal["llm_tokens", "llm_usd", "wall_seconds", "gpu_minutes", "trials"]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def _check_regexes(values: list[str]) -> list[str]:
    for value in values:
        try:
            re.compile(value)
        except re.error as error:  # not a ValueError: pydantic would not turn it into a field error
            raise ValueError(f"regex {value!r} does not compile: {error}") from None
    return values


class PathRule(_Strict):
    """Gitignore-style globs over workspace-relative paths. Deny rules match case-insensitively."""

    id: RuleId
    effect: Effect
    ops: list[Literal["read", "write"]] = Field(min_length=1)
    globs: list[str] = Field(min_length=1)
    reason: str = ""

    @field_validator("globs")
    @classmethod
    def _globs_compile(cls, value: list[str]) -> list[str]:
        for glob in value:
            if not glob or "\x00" in glob or "\\" in glob:
                raise ValueError(f"glob {glob!r} is empty or has NUL/backslash")
        pathspec.GitIgnoreSpec.from_lines(value)
        return value


class ContentRule(_Strict):
    """A regex searched in every added line of a patch and in written file content: a match denies."""

    id: RuleId
    pattern: str
    reason: str = ""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        return _check_regexes([value])[0]


class CommandRule(_Strict):
    """argv[0] matched exactly; `args` are regexes full-matched position by position against argv[1:]."""

    id: RuleId
    effect: Effect
    argv0: str = Field(min_length=1)
    args: list[str] | None = None  # None: any arguments
    allow_extra_args: bool = False  # argv longer than `args` is allowed when True
    forbid_args: list[str] = Field(default_factory=list)  # regexes: any argv[1:] full-matching one
    reason: str = ""  # ... makes an allow/ask rule not match (e.g. git --output=..., -c ...)

    @field_validator("args")
    @classmethod
    def _args_compile(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _check_regexes(value)

    @field_validator("forbid_args")
    @classmethod
    def _forbid_compile(cls, value: list[str]) -> list[str]:
        return _check_regexes(value)


class ServerRule(CommandRule):
    """A command that starts a long-running server bound to `host` on one of `ports`."""

    host: str = "127.0.0.1"
    ports: list[Port] = Field(min_length=1)


class NetworkRule(_Strict):
    """An outbound connection to `host` (exact, case-insensitive) on one of `ports`."""

    id: RuleId
    effect: Effect
    host: str = Field(min_length=1)
    ports: list[Port] = Field(min_length=1)
    reason: str = ""


class EnvPolicy(_Strict):
    """Environment variables a command may set: `allow` lists names (a trailing * is a prefix)."""

    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)  # added to the built-in deny list, never replaces it


class GpuLimits(_Strict):
    max_devices: int = Field(default=0, ge=0)
    max_gpu_minutes: float = Field(default=0.0, ge=0)


class Policy(_Strict):
    """One policy file. Order inside a list does not matter: deny beats ask beats allow."""

    schema_version: Literal[1]
    name: str = Field(min_length=1)
    description: str = ""
    paths: list[PathRule] = Field(default_factory=list)
    content: list[ContentRule] = Field(default_factory=list)
    commands: list[CommandRule] = Field(default_factory=list)
    servers: list[ServerRule] = Field(default_factory=list)
    env: EnvPolicy = Field(default_factory=EnvPolicy)
    network: list[NetworkRule] = Field(default_factory=list)
    gpu: GpuLimits = Field(default_factory=GpuLimits)
    budget: dict[Resource, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_ids(self) -> Policy:
        seen: set[str] = set()
        for group in (self.paths, self.content, self.commands, self.servers, self.network):
            for rule in group:
                if rule.id in seen:
                    raise ValueError(f"rule id {rule.id!r} is used twice; ids must be unique")
                seen.add(rule.id)
        return self


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that rejects duplicate mapping keys (a later key would silently win)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    keys: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def format_validation_error(where: str, error: ValidationError) -> str:
    lines = [f"{where}: {error.error_count()} error(s)"]
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"]) or "<root>"
        lines.append(f"  {loc}: {item['msg']}")
    return "\n".join(lines)


def parse_policy(data: object, *, where: str = "<policy>") -> Policy:
    try:
        return Policy.model_validate(data)
    except ValidationError as error:
        message = format_validation_error(where, error)
        raise PolicyLoadError(f"{message}\n  fix the file; see policies/README.md") from None


def load_policy(path: Path) -> Policy:
    """Read and validate one policy YAML file; raise PolicyLoadError naming the file and field path."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PolicyLoadError(f"{path}: cannot read policy file ({error.strerror}); check the path") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise PolicyLoadError(f"{path}: not valid YAML: {error}") from None
    return parse_policy(data, where=str(path))


def policy_sha256(policy: Policy) -> str:
    """sha256 over the RFC 8785 canonical JSON of the validated policy (what the audit log records)."""
    return hashlib.sha256(rfc8785.dumps(policy.model_dump(mode="json"))).hexdigest()
