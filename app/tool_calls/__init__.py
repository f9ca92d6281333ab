"""Tool calling, API-neutral: what each API's routes share.

- `spec`: `Tool`, `ToolChoice`, `ToolCall` (neutral records; each API maps its own shapes);
- `format`: `CallFormat`, the model family's native call format, derived from its chat
  template by rendering a probe call (or the generic JSON format when the template has no
  tool support), and how to render a conversation with tools for it;
- `grammar`: the llguidance (Lark) grammar that enforces calls in that format;
- `parser`: `ToolCallParser`, which turns the engine's output text into neutral events
  (`TextDelta`, `CallStart`, `CallArgs`) once; each API only renders those events.
"""

from app.tool_calls.format import CallFormat, derive_format
from app.tool_calls.grammar import tool_grammar
from app.tool_calls.parser import CallArgs, CallStart, TextDelta, ToolCallParser
from app.tool_calls.spec import Tool, ToolCall, ToolChoice

__all__ = [
    "CallArgs",
    "CallFormat",
    "CallStart",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolChoice",
    "derive_format",
    "tool_grammar",
]
