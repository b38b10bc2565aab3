"""Where a worker finds secret values (runner/tenancy/secret_sources.py): its environment
first, then one file per variable in a mounted directory; names that could leave it never.
And values sealed in the journal (runner/tenancy/sealed_secrets.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.runner.tenancy.sealed_secrets import SecretKeys, new_key, open_sealed, seal
from qjsflow.runner.tenancy.secret_sources import MAX_SECRET_BYTES, SecretSource


def test_the_environment_wins_then_the_mounted_files(tmp_path: Path) -> None:
    (tmp_path / "KEY").write_text("from-file\n")
    (tmp_path / "ONLY_FILE").write_text("file-value")
    source = SecretSource({"KEY": "from-env", "QJSFLOW_SECRETS_DIR": str(tmp_path)})
    assert source.get("KEY") == "from-env"
    assert source.get("ONLY_FILE") == "file-value"
    assert source.get("MISSING") is None
    assert source.providers() == ("environment", f"files:{tmp_path}")


def test_systemds_credentials_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "TOKEN").write_text("t0k3n\n")
    source = SecretSource({"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert source.get("TOKEN") == "t0k3n"  # the trailing newline a mount writes is not part


def test_names_that_could_leave_the_directory_and_oversized_files_are_refused(
    tmp_path: Path,
) -> None:
    inside = tmp_path / "mounted"
    inside.mkdir()
    (tmp_path / "outside").write_text("not yours")
    (inside / "BIG").write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    source = SecretSource({"QJSFLOW_SECRETS_DIR": str(inside)})
    assert source.get("../outside") is None
    assert source.get("BIG") is None
    assert SecretSource({}).providers() == ("environment",)


def test_a_sealed_value_opens_only_with_its_key_in_its_own_slot(tmp_path: Path) -> None:
    new_key(tmp_path, "acme")
    new_key(tmp_path, "beta")
    keys = SecretKeys(folder=str(tmp_path))
    acme, beta = keys.key("acme"), keys.key("beta")
    assert acme is not None
    assert beta is not None
    sealed = seal(acme, "acme", "API_KEY", "v4lue")
    assert "v4lue" not in repr(sealed)
    assert open_sealed(acme, "acme", "API_KEY", sealed) == "v4lue"
    assert open_sealed(beta, "acme", "API_KEY", sealed) is None  # another scope's key
    assert open_sealed(acme, "acme", "OTHER", sealed) is None  # moved to another name
    assert open_sealed(acme, "beta", "API_KEY", sealed) is None  # or another scope
    flipped = replace(sealed, ciphertext=sealed.ciphertext[:-4] + "AAAA")
    assert open_sealed(acme, "acme", "API_KEY", flipped) is None  # tampered with
    assert keys.key("../acme") is None  # a name that could leave the folder
    with pytest.raises(InvalidInput, match="1 byte to"):
        seal(acme, "acme", "API_KEY", "")
