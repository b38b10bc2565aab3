"""Secret values sealed in the journal (docs/TENANCY.md, "Scope configuration"): each is
encrypted with AES-GCM (the `cryptography` package) under a key of its own scope, which only
workers and operators hold, in a directory of key files (`QJSFLOW_SECRET_KEYS`, one
`SCOPE.key` a scope). The journal holds the nonce, the ciphertext and which key sealed it; the
scope and the secret's name are bound in as associated data, so a sealed value moved to another
row does not open. Destroying a scope's key file makes all of its sealed values unreadable,
and no other scope's.

A configuration names such a secret with the source `@journal`:
`{"secrets": {"API_KEY": "@journal"}}`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from qjsflow.bridge import InvalidInput
from qjsflow.runner.tenancy.scopes import validate_scope

__all__ = [
    "JOURNAL_SOURCE", "KEYS_VARIABLE", "MAX_SEALED_BYTES", "Sealed", "SecretKeys", "new_key",
    "open_sealed", "seal",
]  # fmt: skip

JOURNAL_SOURCE = "@journal"  # a configuration's source for a value sealed in the journal
KEYS_VARIABLE = "QJSFLOW_SECRET_KEYS"
MAX_SEALED_BYTES = 64 * 1024
_KEY_BYTES = 32  # AES-256


@dataclass(frozen=True, slots=True)
class Sealed:
    """A value as the journal holds it (base64 text)."""

    key_id: str
    nonce: str
    ciphertext: str


def key_id(key: bytes) -> str:
    """Which key sealed a value (a digest of it: the key itself is never stored)."""
    return hashlib.sha256(b"qjsflow secret key\0" + key).hexdigest()[:16]


def seal(key: bytes, scope: str, name: str, value: str) -> Sealed:
    data = value.encode()
    if not data or len(data) > MAX_SEALED_BYTES:
        raise InvalidInput(f"a secret's value is 1 byte to {MAX_SEALED_BYTES // 1024} KiB")
    nonce = secrets.token_bytes(12)  # random, never reused under a key (2^-96 a pair)
    sealed = AESGCM(key).encrypt(nonce, data, _bound(scope, name))
    return Sealed(key_id(key), _b64(nonce), _b64(sealed))


def open_sealed(key: bytes, scope: str, name: str, sealed: Sealed) -> str | None:
    """The value, or None when `key` did not seal it or the row was tampered with."""
    if sealed.key_id != key_id(key):
        return None
    try:
        nonce, data = base64.b64decode(sealed.nonce), base64.b64decode(sealed.ciphertext)
        return AESGCM(key).decrypt(nonce, data, _bound(scope, name)).decode()
    except (InvalidTag, ValueError, UnicodeDecodeError):
        return None


def _bound(scope: str, name: str) -> bytes:
    return f"qjsflow\0{scope}\0{name}".encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class SecretKeys:
    """The scope keys this process holds: `SCOPE.key` files in the folder `QJSFLOW_SECRET_KEYS`
    names (read when needed, so a key destroyed is a key gone)."""

    def __init__(self, environ: Mapping[str, str] | None = None, folder: str | None = None):
        environ = os.environ if environ is None else environ
        chosen = folder or environ.get(KEYS_VARIABLE)
        self.folder = None if not chosen else Path(chosen)

    def key(self, scope: str) -> bytes | None:
        if self.folder is None:
            return None
        try:
            text = (self.folder / f"{validate_scope(scope)}.key").read_text().strip()
            key = base64.b64decode(text, validate=True)
        except (OSError, ValueError, InvalidInput):
            return None
        return key if len(key) == _KEY_BYTES else None


def new_key(folder: Path, scope: str) -> Path:
    """A new key for `scope`, written to `folder` readable by its owner only; an existing key
    is never replaced (its sealed values would be lost)."""
    path = folder / f"{validate_scope(scope)}.key"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidInput(f"scope {scope!r} has a key already ({path}): it is kept") from None
    with os.fdopen(handle, "w") as out:
        out.write(_b64(secrets.token_bytes(_KEY_BYTES)) + "\n")
    return path
