"""Turn arbitrary Python values (tasks, outputs, request bodies) into JSON-safe copies."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["jsonable"]

_MAX_DEPTH = 64


def jsonable(value: object, _depth: int = 0) -> Any:
    """A JSON-safe deep copy of `value`.

    Dicts, lists, tuples and sets are copied (so later changes to the user's objects do not change a
    record), pydantic models and dataclasses become dicts, and anything else becomes its `repr`.
    """
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if _depth >= _MAX_DEPTH:  # self-referencing structures: stop instead of recursing forever
        return repr(value)
    depth = _depth + 1
    if isinstance(value, Mapping):
        return {str(key): jsonable(item, depth) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item, depth) for item in value]
    if isinstance(getattr(value, "__pydantic_fields_set__", None), set):  # a pydantic v2 model instance
        # Its field values and extras, read directly: several times faster than model_dump(), and
        # recording runs on every LLM call's path. None fields are left out, as exclude_none would.
        data = dict(value.__dict__)
        data.update(getattr(value, "__pydantic_extra__", None) or {})
        return {key: jsonable(item, depth) for key, item in data.items() if item is not None}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), depth) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json", exclude_none=True), depth)
        except TypeError:  # pydantic v1-style model_dump without these arguments
            return jsonable(dump(), depth)
    return repr(value)
