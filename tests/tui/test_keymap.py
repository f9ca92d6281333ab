"""Bindings have ids; config.toml overrides them; F1 lists them."""

from __future__ import annotations

from tests.tui.conftest import SIZE, ready, reply_done, send, wait_until
from tui.config import load_config
from tui.keymap import ALL_KEYS
from tui.screens.help import HelpScreen


def test_every_binding_has_a_unique_id():
    ids = [s.id for s in ALL_KEYS]
    assert len(ids) == len(set(ids)) and all(ids)


def test_config_file_parsing(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        'theme = "nord"\n[keymap]\n"chat.new" = "f12"\n[defaults]\ntemperature = 0.3\n'
    )
    config = load_config(path)
    assert config.keymap == {"chat.new": "f12"} and config.theme == "nord"
    assert config.defaults.temperature == 0.3 and not config.problems
    path.write_text("[keymap\n")
    assert load_config(path).problems
    assert load_config(tmp_path / "missing.toml").keymap == {}


async def test_keymap_override_is_applied(make_app, scripted, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[keymap]\n"reply.regenerate" = "f11"\n"input.send" = "ctrl+s"\n')
    config = load_config(path)
    engine = scripted(["one", "two"])
    app = make_app(engine, config)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.prompt.text = "hi"
        await pilot.press("enter")  # no longer sends: inserts a newline
        await pilot.pause()
        assert app.prompt.text.count("\n") == 1 and not engine.submitted
        await pilot.press("ctrl+s")
        await reply_done(pilot)
        assert len(engine.submitted) == 1
        await pilot.press("ctrl+r")  # old key: nothing
        await pilot.pause()
        assert len(engine.submitted) == 1
        await pilot.press("f11")
        await reply_done(pilot)
        assert len(engine.submitted) == 2
        assert app.conversation.messages()[-1].text == "two"
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        rows = {binding_id: keys for keys, _, binding_id in app.screen.rows}
        assert rows["reply.regenerate"] == "f11" and rows["chat.new"] == "ctrl+n"


async def test_theme_cycles_and_persists(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.theme == "textual-dark"
        await pilot.press("f9")
        assert app.theme == "nord"
        await pilot.press("f9")
        assert app.theme == "gruvbox"
    app2 = make_app()
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app2.theme == "gruvbox"


async def test_send_ignored_while_streaming(held_reply):
    async with held_reply(["a b c"], "first") as (pilot, engine):
        await send(pilot, "second")
        assert len(engine.submitted) == 1 and pilot.app.prompt.text == "second"
        engine.release()
        await reply_done(pilot)
