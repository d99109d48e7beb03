"""Create and edit forms for keys, teams, users, customers and tags.

A form shows the fields the admin API accepts for that entity (its ``*_FIELDS`` table),
so a field the API gains appears here too. Form text becomes the API's JSON: numbers,
comma-separated lists, JSON objects. The API validates, as it does for ``curl``; its
message is shown next to the form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import attrs
import orjson

from triogate.api.admin.fields import (
    END_USER_FIELDS,
    KEY_FIELDS,
    TAG_FIELDS,
    TEAM_FIELDS,
    USER_FIELDS,
)
from triogate.ui.html import Html, el, field, select

#: The roles a user may have, as the form offers them (the API's default first).
ROLE_CHOICES = (
    ("internal_user", "internal user: its own keys and spend"),
    ("internal_user_viewer", "internal user viewer: reads its own keys and spend"),
    ("proxy_admin_viewer", "admin viewer: reads everything, changes nothing"),
    ("proxy_admin", "admin: everything"),
)

if TYPE_CHECKING:
    from collections.abc import Mapping


class FormError(ValueError):
    """A form value the dashboard cannot even turn into JSON (the message names it)."""


@final
@attrs.frozen
class Spec:
    """How one API field appears in a form: label, input type, hint, JSON conversion."""

    label: str
    kind: str = "text"  # text | usd | int | list | json | duration | role
    hint: str = ""


SPECS: Mapping[str, Spec] = {
    "key_alias": Spec("Alias", hint="A name people recognise."),
    "team_alias": Spec("Team name"),
    "user_alias": Spec("Name"),
    "alias": Spec("Name"),
    "user_email": Spec("Email"),
    "user_role": Spec("Role", "role", "What the user's keys may do here and in the admin API."),
    "description": Spec("Description"),
    "team_id": Spec("Team id"),
    "user_id": Spec("User id"),
    "max_budget": Spec("Budget (USD)", "usd", "Spend allowed per budget period."),
    "budget_duration": Spec("Budget period", "duration", "30s, 1h, 1d, 30d; empty = never resets."),
    "duration": Spec("Expires after", "duration", "e.g. 30d; empty = never."),
    "rpm_limit": Spec("Requests per minute", "int"),
    "tpm_limit": Spec("Tokens per minute", "int"),
    "max_parallel_requests": Spec("Parallel requests", "int"),
    "models": Spec("Models", "list", "Comma-separated model groups; empty = all."),
    "tags": Spec("Tags", "list", "Comma-separated."),
    "aliases": Spec("Model aliases", "json", 'JSON, e.g. {"fast": "gpt-4o-mini"}.'),
    "model_rpm_limit": Spec("RPM per model", "json", 'JSON, e.g. {"gpt-4o": 10}.'),
    "model_tpm_limit": Spec("TPM per model", "json", "JSON object."),
    "metadata": Spec("Metadata", "json", "JSON object."),
}

FIELDS: Mapping[str, Mapping[str, Any]] = {
    "keys": KEY_FIELDS, "teams": TEAM_FIELDS, "users": USER_FIELDS,
    "customers": END_USER_FIELDS, "tags": TAG_FIELDS,
}

#: The id field each kind's ``new`` form asks for (teams and users get one if left empty).
ID_FIELDS: Mapping[str, tuple[str, str, bool]] = {
    "teams": ("team_id", "Team id", False),
    "users": ("user_id", "User id", False),
    "customers": ("user_id", "Customer id", True),
    "tags": ("name", "Tag", True),
}

#: Fields that only make sense when creating (an update would restart the clock).
CREATE_ONLY = frozenset({"duration"})


def editable(kind: str, *, creating: bool) -> list[str]:
    """The form's fields for ``kind``, in :data:`SPECS` order."""
    names = [n for n in SPECS if n in FIELDS[kind]]
    return [n for n in names if creating or n not in CREATE_ONLY]


def shown(value: Any, spec: Spec) -> str:
    """A stored value as form text."""
    if value is None or value == [] or value == {}:
        return ""
    if spec.kind == "list":
        return ", ".join(map(str, value))
    if spec.kind == "json":
        return orjson.dumps(value).decode()
    if spec.kind == "usd":
        return f"{value:g}"
    return str(value)


def to_json(name: str, text: str, spec: Spec) -> Any:
    """Form text → the API's JSON value (None for empty: "no limit").

    Raises:
        FormError: not a number where one is needed, or not a JSON object.
    """
    text = text.strip()
    if spec.kind == "list":
        return [v.strip() for v in text.split(",") if v.strip()] if text else None
    if not text:
        return None
    if spec.kind == "int":
        try:
            return int(text.replace(",", "").replace("_", ""))
        except ValueError:
            raise FormError(f"{spec.label}: '{text}' is not a whole number") from None
    if spec.kind == "usd":
        return text.lstrip("$")  # exact: the API parses the decimal string
    if spec.kind == "json":
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise FormError(f"{spec.label}: not valid JSON") from None
        if not isinstance(value, dict):
            raise FormError(f"{spec.label}: must be a JSON object")
        return value
    return text


def body_of(kind: str, form: Mapping[str, str], *, creating: bool) -> dict[str, Any]:
    """The admin API body for a submitted form.

    Creating: empty fields are left out (the API's defaults). Updating: an emptied field
    is sent as null, which clears that limit.
    """
    body: dict[str, Any] = {}
    for name in editable(kind, creating=creating):
        if name not in form:
            continue
        value = to_json(name, form[name], SPECS[name])
        if value is not None or not creating:
            body[name] = value
    return body


def render_fields(kind: str, values: Mapping[str, Any] | None = None, *, creating: bool
                  ) -> Html:
    """The labelled inputs of ``kind``'s form, filled from ``values`` (a rendered row or
    the submitted form)."""
    values = values or {}
    parts: list[Html] = []
    for name in editable(kind, creating=creating):
        spec = SPECS[name]
        raw = values.get(name)
        text = raw if isinstance(raw, str) else shown(raw, spec)
        if spec.kind == "role":
            parts.append(select(name, spec.label, ROLE_CHOICES, text or "internal_user"))
            continue
        mode = {"usd": "decimal", "int": "numeric"}.get(spec.kind)
        parts.append(field(name, spec.label, value=text, hint=spec.hint, inputmode=mode,
                           autocomplete="off"))
    return el("div", parts, class_="form-grid")
