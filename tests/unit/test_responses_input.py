"""Responses input items and tools to the shared chat path's shapes (no server)."""

from __future__ import annotations

from app.server.responses_input import (
    ResponsesRequest,
    parse_tool_choice,
    parse_tools,
    template_messages,
)
from app.tool_calls import ToolChoice

NS = {"type": "namespace", "name": "mcp__files__", "description": "Files",
      "tools": [{"type": "function", "name": "read", "parameters": {
          "type": "object", "properties": {"path": {"type": "string"}}}}]}
GROUP = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents",
         "tools": [{"type": "function", "name": "spawn_agent"}]}


def test_namespaces_flatten_and_split_back() -> None:
    tools = parse_tools([NS, GROUP, {"type": "web_search"}, {"type": "function", "name": "f"}])
    assert [t.name for t in tools.tools] == ["mcp__files__read", "multi_agent_v1__spawn_agent",
                                             "f"]
    assert tools.hosted == {"web_search"}
    assert tools.split("mcp__files__read") == ("mcp__files__", "read")
    assert tools.split("multi_agent_v1__spawn_agent") == ("multi_agent_v1", "spawn_agent")
    assert tools.split("f") == (None, "f")
    named = {"type": "function", "name": "read", "namespace": "mcp__files__"}
    assert parse_tool_choice(named, tools) == ToolChoice("function", "mcp__files__read")
    assert parse_tool_choice("auto", parse_tools([{"type": "web_search"}])) == \
        ToolChoice("none")


def test_items_become_template_messages() -> None:
    tools = parse_tools([NS])
    body = ResponsesRequest(instructions="Be brief.", input=[
        {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
        {"role": "user", "content": "Read a.txt"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Reading."}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "namespace": "mcp__files__",
         "arguments": "{\"path\": \"a.txt\"}", "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "mcp__files__",
         "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "hello"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "bye"}]},
    ])
    call = {"type": "function", "function": {"name": "mcp__files__read"}}
    assert template_messages(body, tools) == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "Read a.txt"},
        {"role": "assistant", "content": "Reading.", "tool_calls": [
            {"id": "c1", **call, "function": {**call["function"], "arguments": {"path": "a.txt"}}},
            {"id": "c2", **call, "function": {**call["function"], "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "mcp__files__read", "content": "hello"},
        {"role": "tool", "tool_call_id": "c2", "name": "mcp__files__read", "content": "bye"},
    ]
