"""What a `strict` tool's schema must say: every object in it closed (`"additionalProperties": false`).

A strict tool promises that a call's arguments validate against the schema. A schema that leaves an object
open keeps that promise while the model adds keys of its own, and a tool function that receives an
argument it does not take raises `TypeError` in the user's agent. OpenAI's strict mode refuses such a
schema with a 400 ("'additionalProperties' is required to be supplied and to be false"), and Anthropic's
strict tool use lists `additionalProperties: false` as required on objects. The server refuses it the same
way, on all three APIs, rather than close the objects behind the caller's back: a request that works here
then works there too, and a schema that was meant to be open is not silently narrowed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from lightning_sdk.serving.errors import APIError

__all__ = ["check_strict_tools", "open_objects"]

# Keywords whose value is one subschema, a list of them, or a name -> subschema mapping.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def open_objects(schema: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The paths (keys from the schema's root) of every object schema in `schema` that does not set
    `"additionalProperties": false`. An object schema is one whose `type` is or includes `"object"`, or
    that lists `properties` without a type."""
    if not isinstance(schema, Mapping):
        return
    kind = schema.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    if (is_object or (kind is None and "properties" in schema)) and schema.get(
        "additionalProperties"
    ) is not False:
        yield path
    for key in _ONE:
        if isinstance(schema.get(key), Mapping):
            yield from open_objects(schema[key], (*path, key))
    for key in _LIST:
        if isinstance(schema.get(key), list):
            for index, item in enumerate(schema[key]):
                yield from open_objects(item, (*path, key, str(index)))
    for key in _NAMED:
        if isinstance(schema.get(key), Mapping):
            for name, item in schema[key].items():
                yield from open_objects(item, (*path, key, str(name)))


def check_strict_tools(tools: list[dict[str, Any]]) -> None:
    """A 400 naming the first strict tool (in chat terms) whose `parameters` leave an object open."""
    for position, tool in enumerate(tools):
        function = tool["function"]
        schema = function.get("parameters")
        if not function.get("strict") or not isinstance(schema, Mapping):
            continue
        for path in open_objects(schema):
            where = "the schema's root" if not path else "/".join(path)
            raise APIError.bad_request(
                f"Invalid schema for tool {function['name']!r}: it is strict, and the object at {where} "
                "of its parameters (a Messages tool's input_schema) does not set 'additionalProperties': "
                "false. Strict tools need every object closed, as OpenAI's and Anthropic's strict modes do "
                "(otherwise the model may add arguments the function does not take): add it to that "
                "object, or drop 'strict'.",
                param=f"tools[{position}].function.parameters",
                code="invalid_function_parameters",
            )
