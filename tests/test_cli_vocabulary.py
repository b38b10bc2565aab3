"""One word for each concept on the command line (issue: one vocabulary): the same concept has
one flag everywhere, and an old spelling still works for one release, saying so on stderr."""

from __future__ import annotations

import pytest

from qjsflow.runner.cli.parser import build_parser


@pytest.mark.parametrize(("argv", "dest", "value", "old"), [
    (["signal", "r1", "go", "--input", "7"], "input", "7", None),
    (["signal", "r1", "go", "--payload", "7"], "input", "7", "--payload is deprecated: say --input"),
    (["worker", "--host", "0.0.0.0"], "host", "0.0.0.0", None),
    (["worker", "--listen-host", "0.0.0.0"], "host", "0.0.0.0",
     "--listen-host is deprecated: say --host"),
    (["run", "d", "w", "--mock-tool", "a=1"], "mock_tool", ["a=1"], None),
    (["run", "d", "w", "--mock-tool", "a=1", "--tool", "b=2"], "mock_tool", ["a=1", "b=2"],
     "--tool is deprecated: say --mock-tool"),
])  # fmt: skip
def test_each_concept_has_one_flag_and_old_spellings_still_work_saying_so(
    capsys: pytest.CaptureFixture[str], argv: list[str], dest: str, value: object, old: str | None
) -> None:
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    said = capsys.readouterr().err
    if old is None:
        assert said == ""
    else:
        assert said.startswith("qjsflow: ")
        assert old in said


def test_the_defaults_hold_when_neither_spelling_is_given() -> None:
    assert build_parser().parse_args(["signal", "r1", "go"]).input == "null"
    assert build_parser().parse_args(["worker"]).host == "127.0.0.1"
    assert build_parser().parse_args(["run", "d", "w"]).mock_tool == []


@pytest.mark.parametrize(("command", "new", "old"), [
    (["signal", "r1", "go"], "--input", "--payload"),
    (["worker"], "--host", "--listen-host"),
    (["run", "d", "w"], "--mock-tool", "--tool "),
])  # fmt: skip
def test_help_offers_the_new_spelling_only(
    capsys: pytest.CaptureFixture[str], command: list[str], new: str, old: str
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    text = capsys.readouterr().out
    assert new in text
    assert old not in text
