"""A run's tags (key/value): given by its start (`StartRunInput.tags`), or set by its own code
through a journaled call (`setTags(step, {...})` from `qjsflow`), and found by `list --tag`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from qjsflow.bridge import InvalidInput
from qjsflow.runner.errors import FatalToolError
from qjsflow.runner.store import JournalStore, JournalTransaction

__all__ = ["MAX_TAGS", "TAGS_ADDRESS", "checked_tags", "tags_tool"]

# The host's own tool behind `setTags`: it labels the calling run only, so no manifest need
# declare it.
TAGS_ADDRESS = "qjsflow.tags"
MAX_TAGS = 20
_TAG_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def checked_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """Tags, checked (`InvalidInput` naming the first problem)."""
    if not tags:
        return {}
    if not isinstance(tags, Mapping) or len(tags) > MAX_TAGS:
        raise InvalidInput(f"tags are at most {MAX_TAGS} pairs of a key and a value")
    for key, value in tags.items():
        if not isinstance(key, str) or not _TAG_KEY.fullmatch(key):
            raise InvalidInput(f"invalid tag key {str(key)[:80]!r}: use 1-64 of A-Z, a-z, 0-9, "
                               "_, . and -")  # fmt: skip
        if not isinstance(value, str) or len(value) > 256 or not value.isprintable():
            raise InvalidInput(f"tag {key!r}: its value is printable text of 256 at most")
    return dict(tags)


async def tags_tool(store: JournalStore, run_id: str, args: Any) -> dict[str, str]:
    """`setTags`: set (or replace) tags of the calling run; its tags, all, as they are now.
    Setting the same tags again changes nothing (a call made again after a crash)."""
    given = args.get("tags") if isinstance(args, Mapping) else None
    if not isinstance(given, Mapping):
        raise FatalToolError("setTags takes an object of tag keys and their values")
    try:
        tags = checked_tags(given)
    except InvalidInput as error:
        raise FatalToolError(f"setTags: {error}") from None

    def put(tx: JournalTransaction) -> dict[str, str]:
        now = dict(tx.tags_of(run_id))
        if len({**now, **tags}) > MAX_TAGS:
            raise FatalToolError(f"setTags: a run has at most {MAX_TAGS} tags")
        tx.put_tags(run_id, tags)
        return {**now, **tags}

    result: dict[str, str] = await store.transact(put)
    return result
