"""A chat template that calls raise_exception: the TUI shows its message and keeps running
(issue 14.2)."""

from __future__ import annotations

from tests.tui.conftest import SIZE, ready, reply_done, send
from tui.widgets.conversation import ErrorView, MessageView

NO_SYSTEM = "System role not supported"
TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('" + NO_SYSTEM
    + "') }}{% endif %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


async def test_template_refusal_is_shown_and_the_app_keeps_running(make_app, scripted,
                                                                   monkeypatch):
    monkeypatch.setattr("tests.tui.scripted.TEMPLATE", TEMPLATE)
    app = make_app(scripted(["fine"]), system_prompt="Be brief.")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)
        assert app.is_running
        error = str(app.conversation.query(ErrorView).last().render())
        assert error == f"The model's chat template refused the conversation: {NO_SYSTEM}"
        # without the system prompt the same app answers
        app.session.chat.settings.system_prompt = ""
        await send(pilot, "again")
        await reply_done(pilot)
        assert [v.text for v in app.conversation.query(MessageView)][-1] == "fine"
