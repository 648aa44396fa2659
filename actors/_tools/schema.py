"""Tool schemas as model providers want them: docstring `Args:`, OpenAI strict mode, Anthropic.

`@tool` keeps pydantic's JSON schema of the arguments in `ToolSpec.json_schema` (its hash is
part of the capability snapshot, R22) and the docstring's per-argument descriptions apart in
`ToolSpec.argument_descriptions`. The functions here derive what a provider is sent from a spec
alone, so an agent builds its request from `RunView.tools` (docs/models.md "Tool schemas").
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from steerable.protocol._capabilities import ToolSpec

__all__ = [
    "anthropic_tool",
    "docstring_arguments",
    "model_schema",
    "openai_tool",
    "strict_arguments",
    "strict_compatible",
    "strict_schema",
]

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params)\s*:\s*$")
_OTHER_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_ARG_LINE = re.compile(
    r"^\*{0,2}(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:\s*(?P<rest>.*)$"
)
# Keywords OpenAI's strict mode rejects or ignores; pydantic writes `title` and `default`.
_NOT_STRICT = ("title", "default", "examples")


def docstring_arguments(fn: Callable[..., Any]) -> dict[str, str]:
    """Argument name -> description, from a Google-style docstring's `Args:` section.

    `name: text`, `name (type): text`, continuation lines indented further. Other sections
    (`Returns:`, `Raises:`...) end it. An undocumented argument is absent.
    """
    doc = None if isinstance(fn, functools.partial) else inspect.getdoc(fn)
    if not doc:
        return {}
    out: dict[str, str] = {}
    lines = doc.splitlines()
    inside = False
    indent: int | None = None
    current: str | None = None
    for raw in lines:
        stripped = raw.strip()
        if not inside:
            inside = bool(_SECTION.match(stripped))
            continue
        if not stripped:
            current = None
            continue
        depth = len(raw) - len(raw.lstrip())
        if depth == 0 and _OTHER_SECTION.match(stripped):
            break  # the next section
        if indent is None:
            indent = depth
        if depth <= indent:
            if depth < indent:
                break
            match = _ARG_LINE.match(stripped)
            current = match.group("name") if match else None
            if current is not None:
                out[current] = match.group("rest").strip() if match else ""
        elif current is not None:
            out[current] = f"{out[current]} {stripped}".strip()
    return {name: text for name, text in out.items() if text}


def model_schema(spec: ToolSpec) -> dict[str, Any]:
    """The arguments' JSON schema with the docstring descriptions merged in, titles dropped."""
    schema = copy.deepcopy(spec.json_schema) or {"type": "object", "properties": {}}
    schema.pop("title", None)
    properties = schema.setdefault("properties", {})
    schema.setdefault("type", "object")
    for name, prop in properties.items():
        if isinstance(prop, dict):
            prop.pop("title", None)
            text = spec.argument_descriptions.get(name)
            if text and "description" not in prop:
                prop["description"] = text
    return schema


def strict_compatible(spec: ToolSpec) -> bool:
    """Whether the arguments can be expressed in OpenAI strict mode (no free-form objects)."""
    return _closed(spec.json_schema)


def _closed(node: Any) -> bool:
    if isinstance(node, dict):
        extra = node.get("additionalProperties")
        if extra is not None and extra is not False:
            return False  # dict[str, X] / Any-valued maps: strict mode needs every key named
        if node.get("type") == "object" and "properties" not in node and "$ref" not in node:
            return False
        return all(_closed(v) for v in node.values())
    if isinstance(node, list):
        return all(_closed(v) for v in node)
    return True


def strict_schema(spec: ToolSpec) -> dict[str, Any]:
    """A schema that passes OpenAI strict mode: closed objects, every property required,
    optional ones nullable, no `default`/`title`. Use `strict_arguments` on what comes back.

    Raises:
        ValueError: The arguments hold a free-form object (see `strict_compatible`).
    """
    if not strict_compatible(spec):
        raise ValueError(f"tool {spec.name!r} has free-form object arguments; strict mode is off")
    schema = model_schema(spec)
    _strictify(schema)
    for definition in schema.get("$defs", {}).values():
        _strictify(definition)
    return schema


def _strictify(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _strictify(item)
        return
    if not isinstance(node, dict):
        return
    for key in _NOT_STRICT:  # schema keywords: a property named "title" lives in "properties"
        node.pop(key, None)
    properties = node.get("properties")
    if isinstance(properties, dict):
        required = set(node.get("required", ()))
        for name, prop in properties.items():
            if name not in required and isinstance(prop, dict) and not _accepts_null(prop):
                properties[name] = _nullable(prop)
        node["required"] = list(properties)
        node["additionalProperties"] = False
        for prop in properties.values():
            _strictify(prop)
    for key in ("items", "anyOf", "allOf", "prefixItems"):
        if key in node:
            _strictify(node[key])


def _accepts_null(prop: Mapping[str, Any]) -> bool:
    kind = prop.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(isinstance(m, dict) and _accepts_null(m) for m in prop.get("anyOf", ()))


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    kind = prop.get("type")
    if isinstance(kind, str) and "enum" not in prop:
        return {**prop, "type": [kind, "null"]}
    description = prop.get("description")
    inner = {k: v for k, v in prop.items() if k != "description"}
    out: dict[str, Any] = {"anyOf": [inner, {"type": "null"}]}
    if description is not None:
        out["description"] = description
    return out


def strict_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Undo strict mode's nulls: drop a null for an optional argument that does not take None.

    Strict mode makes the model send every argument, `null` for one it leaves out; the tool's
    default then applies, as if it had been omitted.
    """
    properties = spec.json_schema.get("properties", {})
    required = set(spec.json_schema.get("required", ()))
    out: dict[str, Any] = {}
    for name, value in arguments.items():
        prop = properties.get(name)
        if (
            value is None
            and name not in required
            and isinstance(prop, dict)
            and not _accepts_null(prop)
        ):
            continue
        out[name] = value
    return out


def openai_tool(spec: ToolSpec, *, name: str | None = None, strict: bool = True) -> dict[str, Any]:
    """The tool as an OpenAI chat-completions `tools` entry (strict when the schema allows).

    Args:
        spec: The tool's spec.
        name: The name sent to the provider (default `spec.name`).
        strict: Ask for strict mode; ignored for a schema strict mode cannot express.
    """
    use_strict = strict and strict_compatible(spec)
    function: dict[str, Any] = {
        "name": name or spec.name,
        "description": spec.description,
        "parameters": strict_schema(spec) if use_strict else model_schema(spec),
    }
    if use_strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def anthropic_tool(spec: ToolSpec, *, name: str | None = None) -> dict[str, Any]:
    """The tool as an Anthropic Messages `tools` entry (`name`, `description`, `input_schema`)."""
    return {
        "name": name or spec.name,
        "description": spec.description,
        "input_schema": model_schema(spec),
    }
