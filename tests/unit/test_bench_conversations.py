"""The speculative bench's conversation workloads (`app.bench.agent_loop`): what each turn's
prompt holds, and when a conversation ends."""

from __future__ import annotations

from app.bench.agent_loop import AGENT_LOOP, CHAT, Conversations
from app.bench.spec import WORKLOADS, requests_for
from tests.fakes.tokenizer import FakeTokenizer

TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def text(tok: FakeTokenizer, ids: list[int]) -> str:
    return tok.decode(ids)


def test_a_chat_turn_is_the_conversation_so_far_with_the_next_request():
    tok = FakeTokenizer(chat_template=TEMPLATE)
    talk = Conversations(tok, 64, CHAT)
    first, params = talk.first(1)
    assert text(tok, first) == ("[user] Write a Python function that checks whether a string "
                                "is a palindrome.\n[assistant]")
    assert (params.temperature, params.max_tokens) == (0, 64)
    replies = [tok.encode("def p(s): ..."), tok.encode("def p(s: str) -> bool: ...")]
    prompt, _ = talk.follow(1, replies)
    assert text(tok, prompt) == (
        "[user] Write a Python function that checks whether a string is a palindrome.\n"
        "[assistant] def p(s): ...\n[user] Add type hints.\n"
        "[assistant] def p(s: str) -> bool: ...\n[user] Add a docstring.\n[assistant]")


def test_conversations_end_after_their_turns():
    tok = FakeTokenizer(chat_template=TEMPLATE)
    for script, turns in ((CHAT, 6), (AGENT_LOOP, 10)):
        talk = Conversations(tok, 8, script)
        assert script.turns == turns
        assert talk.follow(0, [[65]] * (turns - 1)) is not None
        assert talk.follow(0, [[65]] * turns) is None


def test_the_agent_loop_keeps_its_system_prompt_and_tool_results():
    tok = FakeTokenizer(chat_template=TEMPLATE)
    prompt, _ = Conversations(tok, 8).follow(0, [tok.encode("reading it")])
    rendered = text(tok, prompt)
    assert rendered.startswith("[system] You are a coding agent")
    assert "[assistant] reading it\n[user] read_file src/shop.py:\ndef total_price" in rendered


def test_the_spec_bench_serves_both_conversation_workloads():
    tok = FakeTokenizer(chat_template=TEMPLATE)

    class Runner:
        tokenizer = tok

    assert {"agent-loop", "chat"} <= set(WORKLOADS)
    chats = requests_for("chat", Runner(), 3, 16)
    assert [text(tok, p).split("\n")[0] for p, _ in chats] == [
        "[user] Write a Python function that returns the n-th Fibonacci number.",
        "[user] Write a Python function that checks whether a string is a palindrome.",
        "[user] Write a Python function that returns the n-th Fibonacci number."]
