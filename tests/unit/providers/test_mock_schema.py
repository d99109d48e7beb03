"""The mock's JSON values satisfy their schemas (checked by ``jsonschema``)."""

from __future__ import annotations

from datetime import datetime  # noqa: TC003 (pydantic reads annotations at run time)
from enum import Enum
from typing import Any, Literal

import jsonschema
import pydantic
import pytest

from triogate.providers.mock_schema import instance


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Address(pydantic.BaseModel):
    street: str = pydantic.Field(min_length=12)
    zip: str | None
    tags: list[str] = pydantic.Field(min_length=2, max_length=3)


class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=18, lt=130, multiple_of=5)
    score: float = pydantic.Field(gt=0.5, le=1.0)
    colour: Colour
    kind: Literal["a", "b"]
    born: datetime
    home: Address
    others: list[Address]
    extra: dict[str, int]
    friend: Person | None = None


SCHEMAS: list[Any] = [
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": -2},
     "minItems": 3, "uniqueItems": True},
    {"type": "number", "exclusiveMaximum": -1},
    {"type": "integer", "minimum": 7, "multipleOf": 4},
    {"type": ["string", "null"], "format": "email"},
    {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    {"oneOf": [{"const": 3}, {"type": "string"}]},
    {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"enum": [1, 2]}}, "required": ["b"]}]},
    {"type": "object", "required": ["x"], "additionalProperties": {"type": "integer"}},
    {"type": "string", "minLength": 20, "maxLength": 25},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
     "items": False},
    {"$defs": {"node": {"type": "object", "properties": {
        "child": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["child"]}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date-time"},
                                      "u": {"type": "string", "format": "uuid"}}},
    {"type": "number", "minimum": 0.5, "exclusiveMinimum": 0.5},
    {"type": "integer", "minimum": 1, "exclusiveMinimum": True},  # draft 4
    {},
    Person.model_json_schema(),
    pydantic.TypeAdapter(list[Colour]).json_schema(),
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_value_satisfies_the_schema(schema: Any) -> None:
    value = instance(schema)
    validator = (jsonschema.Draft4Validator if schema.get("exclusiveMinimum") is True
                 else jsonschema.Draft202012Validator)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(value)
    assert instance(schema) == value  # deterministic


def test_a_pydantic_model_parses_the_value() -> None:
    person = Person.model_validate(instance(Person.model_json_schema()))
    assert person.age >= 18 and person.age % 5 == 0 and len(person.home.tags) >= 2
