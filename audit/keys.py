"""Ed25519 signing key (outside the sandbox), public keys, checkpoint messages and head anchors."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.base import Anchor
from audit.canon import canonical, sha256_hex
from audit.errors import AuditKeyError
from audit.fsio import fsync_dir, write_new_file

__all__ = [
    "PUBKEY_NAME",
    "anchor_path",
    "default_anchor_dir",
    "default_key_path",
    "key_id",
    "load_or_create_key",
    "load_public_key",
    "public_pem",
    "read_anchor",
    "sign",
    "signed_message",
    "verify_signature",
    "write_anchor",
]

PUBKEY_NAME = "audit-key.pub"


def default_key_path() -> Path:
    """$RATCHET_AUDIT_KEY, else ~/.config/ratchet/audit-key.ed25519 (outside any workspace)."""
    env = os.environ.get("RATCHET_AUDIT_KEY")
    return Path(env) if env else Path.home() / ".config" / "ratchet" / "audit-key.ed25519"


def default_anchor_dir(key_path: Path) -> Path:
    return key_path.parent / "anchors"


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    """Load the PEM private key at `path`, creating it 0600 (parent 0700) if absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:
            write_new_file(path, pem, mode=0o600)
        except FileExistsError:
            pass  # another process created it first: load theirs
        else:
            return key
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_mode & 0o077:
        raise AuditKeyError(f"{path}: signing key is a symlink or readable by others; run chmod 600 {path}")
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as error:
        raise AuditKeyError(f"{path}: cannot load the Ed25519 signing key: {error}") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise AuditKeyError(f"{path}: not an Ed25519 private key")
    return loaded


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public_key(path: Path) -> Ed25519PublicKey:
    """A PEM public key, or the public half of a PEM private key file."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise AuditKeyError(f"{path}: cannot read public key ({error.strerror})") from None
    try:
        if b"PRIVATE KEY" in data:
            private = serialization.load_pem_private_key(data, password=None)
            if isinstance(private, Ed25519PrivateKey):
                return private.public_key()
        else:
            public = serialization.load_pem_public_key(data)
            if isinstance(public, Ed25519PublicKey):
                return public
    except ValueError as error:
        raise AuditKeyError(f"{path}: not a PEM key: {error}") from None
    raise AuditKeyError(f"{path}: not an Ed25519 key")


def key_id(key: Ed25519PublicKey) -> str:
    return sha256_hex(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def signed_message(*, purpose: str, campaign: str, seq: int, sha256: str) -> bytes:
    """What a checkpoint (purpose 'checkpoint') or anchor (purpose 'anchor') signature covers."""
    return canonical(
        {"domain": f"ratchet.audit.v1.{purpose}", "campaign": campaign, "seq": seq, "sha256": sha256}
    )


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    return base64.b64encode(key.sign(message)).decode("ascii")


def verify_signature(key: Ed25519PublicKey, message: bytes, signature: str) -> bool:
    try:
        key.verify(base64.b64decode(signature, validate=True), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def anchor_path(anchor_dir: Path, campaign: str) -> Path:
    return anchor_dir / f"{campaign}.json"


def write_anchor(anchor_dir: Path, anchor: Anchor) -> Path:
    """Atomically replace the campaign's anchor file (tmp + fsync + rename + fsync dir)."""
    anchor_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = anchor_path(anchor_dir, anchor.campaign)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    body = canonical(
        {
            "campaign": anchor.campaign,
            "seq": anchor.seq,
            "sha256": anchor.sha256,
            "key_id": anchor.key_id,
            "signature": anchor.signature,
        }
    )
    tmp.unlink(missing_ok=True)
    write_new_file(tmp, body + b"\n", mode=0o600)
    os.replace(tmp, target)
    fsync_dir(anchor_dir)
    return target


def read_anchor(path: Path) -> Anchor:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Anchor(
            campaign=str(data["campaign"]),
            seq=int(data["seq"]),
            sha256=str(data["sha256"]),
            key_id=str(data["key_id"]),
            signature=str(data["signature"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise AuditKeyError(f"{path}: cannot read anchor file: {error}") from None
