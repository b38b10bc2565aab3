"""Options several commands share: old spellings kept for a release, bounded numbers, and
`--wait` on the commands that record a change for a worker to drive."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["SECONDS", "WAIT_CHOICES", "add_wait", "number", "old_spelling"]

_KIND: dict[type, str] = {int: "a whole number", float: "a number"}
# What `--wait` waits for: the run's end (given alone), or its next suspension.
WAIT_CHOICES = ("end", "suspended")


class _Deprecated(argparse.Action):
    """An old spelling of an option (docs/OPERATIONS.md keeps one word for each concept): it
    still works for one release, sets the new option's value (or, for a flag that no longer
    does anything, nothing), and says so on stderr."""

    def __init__(self, option_strings: list[str], dest: str, *, instead: str,
                 append: bool = False, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)
        self.instead, self.append = instead, append

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        print(f"qjsflow: {option_string} is deprecated: {self.instead} (the old spelling "
              "goes in the next release)", file=sys.stderr)  # fmt: skip
        if self.nargs == 0:
            return
        if self.append:
            setattr(namespace, self.dest, [*getattr(namespace, self.dest, []), values])
        else:
            setattr(namespace, self.dest, values)


def old_spelling(
    parser: argparse.ArgumentParser, old: str, new: str, *, append: bool = False
) -> None:
    """`old` as a deprecated spelling of the option `new` already added to `parser`."""
    dest = new.removeprefix("--").replace("-", "_")
    parser.add_argument(old, action=_Deprecated, dest=dest, instead=f"say {new}",
                        append=append, help=argparse.SUPPRESS)  # fmt: skip


def number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], Any]:
    """An argparse type: a finite `kind` within [low, high], or a usage error naming the range
    (a value past it would fail later, deep in a library, with no word of the option)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {_KIND[kind]}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is outside {low:g} to {high:g}")
        return value

    parse.__name__ = _KIND[kind]  # argparse names the type in its errors
    return parse


SECONDS = number(float, 0.001, 366 * 86_400.0)  # a wait or a lease: up to a year


def add_wait(command: argparse.ArgumentParser) -> None:
    """`--wait [suspended]` and `--timeout` on a command that records a change and returns
    (start, signal, resume, restart, fork): a worker drives the run; the command waits only
    when asked. `--no-wait`, once the way to not drive inline, is what every command does."""
    command.add_argument(
        "--wait", nargs="?", const="end", choices=WAIT_CHOICES, metavar="suspended",
        help="wait until the run ends and print its output, as `result` (or, with `--wait "
        "suspended`, until it is at rest, suspended with nothing due, and print the run)",
    )  # fmt: skip
    command.add_argument("--timeout", type=SECONDS, metavar="SECONDS",
                         help="how long to --wait (exit 1 past it; the run goes on)")  # fmt: skip
    command.add_argument(
        "--no-wait", action=_Deprecated, nargs=0, dest="no_wait", help=argparse.SUPPRESS,
        instead="every operator command only records now, and a worker drives",
    )  # fmt: skip
