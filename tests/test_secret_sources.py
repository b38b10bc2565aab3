"""Where a worker finds secret values (runner/tenancy/secret_sources.py): its environment
first, then one file per variable in a mounted directory; names that could leave it never."""

from __future__ import annotations

from pathlib import Path

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
