"""Neutral records of tool calling, shared by every API.

An API's route turns its request shapes into these (OpenAI: `app.server.tools`) and renders
`ToolCall`s and parser events back into its own shapes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

# What a tool without `parameters` takes: nothing.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call: `parameters` is a JSON Schema of type object."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))

    def template_view(self) -> dict[str, Any]:
        """The tool as Hugging Face chat templates take it (OpenAI's shape)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """`mode`: "auto" (the model decides), "none" (no call), "required" (at least one
    call), "function" (exactly the tool `name`)."""

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call: `arguments` is JSON text of an object, as the model wrote it; `uid` is a
    unique hex id (each API adds its own prefix, e.g. OpenAI's `call_`)."""

    name: str
    arguments: str
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:24])

    def arguments_object(self) -> dict[str, Any]:
        """`arguments` parsed (a dict; {} if it is not a JSON object)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
