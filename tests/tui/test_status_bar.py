"""The status bar as a user sees it at 80 and 120 columns (the exact text on screen, in
Textual's harness), its short forms and cut route reasons, the details view, F1's keys in
key order, dialogs that leave the bar in view, and the one max-tokens default."""

from __future__ import annotations

import pytest

from app.cli import build_parser
from models.registry import DEFAULT_MAX_TOKENS
from tests.tui.conftest import ready, reply_done, send, wait_until
from tui.chat_settings import ChatSettings
from tui.keymap import effective_keys
from tui.screens.help import HelpScreen
from tui.screens.status import StatusScreen
from tui.widgets.status import StatusInfo, cut, format_details, format_status

ROUTE = "prefilled remotely (measured: the worker prefills faster: 2047 tokens, 47.2 MB of KV)"
INFO = StatusInfo("llamacpp", "smollm2-135m-instruct", "ready", 0.042, 118.04, 812, 8192, 768,
                  (1664, 131072))


def screen_row(app, widget) -> str:
    """The text the terminal shows on `widget`'s first row, whatever screen is on top."""
    return app.screen._compositor.render_strips()[widget.region.y].text


def test_full_and_short_forms() -> None:
    assert format_status(INFO) == (
        "● llamacpp · smollm2-135m-instruct │ TTFT 42 ms │ 118.0 tok/s │ ctx 812/8192 tok │ "
        "cached 768 tok │ KV 1664/131k tok")
    assert format_status(INFO, 118) == format_status(INFO)  # 116 characters: all in full
    assert format_status(INFO, 78) == (
        "● smollm2-135m-instruct │ TTFT 42 ms │ 118 tok/s │ ctx 10% │ KV 1%")
    assert format_status(StatusInfo(spec=(45, 60)), 60) == (
        "◌ ? │ TTFT – │ – tok/s │ ctx – │ KV – │ drafts 75%")
    assert format_status(StatusInfo(kv=(52, 131072)), 30) == "◌ ? │ TTFT – │ – tok/s │ ctx –"
    assert format_status(StatusInfo(kv=(52, 131072))).endswith("│ KV 52/131k tok")


def test_a_long_route_is_cut_within_the_width() -> None:
    info = StatusInfo("llamacpp", "smollm2-135m-instruct", "ready", 0.042, 118.04, 812, 8192,
                      768, (1664, 131072), prefill=ROUTE)
    assert format_status(info, 118) == (
        "● smollm2-135m-instruct │ TTFT 42 ms │ 118 tok/s │ ctx 10% │ KV 1% │ prefilled "
        "remotely (measured: the worker…)")
    assert format_status(info, 78) == (
        "● smollm2-135m-instruct │ TTFT 42 ms │ 118 tok/s │ ctx 10% │ prefilled remote…")
    assert all(len(format_status(info, w)) <= w for w in range(20, 200))
    assert cut(ROUTE, 27) == "prefilled remotely (measu…)"
    assert cut(ROUTE, 26) == "prefilled remotely…"
    assert cut("remote prefill failed (frame_timeout) after 512 tokens", 30) == (
        "remote prefill failed (frame_…")


def test_details_say_everything_in_words() -> None:
    info = StatusInfo(**{**{f: getattr(INFO, f) for f in INFO.__slots__}, "prefill": ROUTE,
                         "spec": (45, 60)})
    assert format_details(info, 1024) == [
        ("State", "ready"), ("Backend", "llamacpp"), ("Model", "smollm2-135m-instruct"),
        ("Time to first token", "42 ms"), ("Decode speed", "118.0 tokens/s"),
        ("Context", "812 of 8192 tokens (10%)"), ("Prompt tokens from cache", "768 tokens"),
        ("KV cache", "1664 of 131072 tokens held (1%), all chats of the engine together"),
        ("Draft tokens", "45 of 60 accepted (75%)"), ("Prefill", ROUTE),
        ("Max tokens per reply", "1024 (F3 changes it for this chat)")]


@pytest.mark.parametrize("size, bar, bar_with_route", [
    ((80, 24),
     "● fake-135m │ TTFT 50 ms │ 100 tok/s │ ctx 1% │ cached 0 │ KV 0/4096 tok",
     "● fake-135m │ TTFT 50 ms │ 100 tok/s │ ctx 1% │ KV 0% │ prefilled remotely…"),
    ((120, 30),
     "● fake · fake-135m │ TTFT 50 ms │ 100.0 tok/s │ ctx 49/4096 tok │ cached 0 tok │ KV "
     "0/4096 tok",
     "● fake-135m │ TTFT 50 ms │ 100 tok/s │ ctx 1% │ cached 0 │ KV 0/4096 tok │ prefilled "
     "remotely (measured: the worker…)"),
])
async def test_status_bar_on_screen(make_app, scripted, size, bar, bar_with_route) -> None:
    app = make_app(scripted(["Hello! How can I help?"]))
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await reply_done(pilot)
        assert screen_row(app, app.status) == f" {bar}".ljust(size[0])
        app.status.update(prefill=ROUTE)
        await pilot.pause()
        assert screen_row(app, app.status) == f" {bar_with_route}".ljust(size[0])

        # the details key shows the route in full; the bar stays in view
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, StatusScreen))
        assert ("Prefill", ROUTE) in app.screen.rows
        assert screen_row(app, app.status) == f" {bar_with_route}".ljust(size[0])
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, StatusScreen))
        await pilot.click("StatusBar")
        await wait_until(pilot, lambda: isinstance(app.screen, StatusScreen))


def test_help_lists_keys_in_key_order() -> None:
    keys = [k for k, _, _ in effective_keys({})]
    assert keys == ["enter", "escape", "ctrl+c", "ctrl+g", "ctrl+j,shift+enter", "ctrl+l",
                    "ctrl+n", "ctrl+o", "ctrl+q", "ctrl+r", "ctrl+t", "f1", "f2", "f3", "f4",
                    "f5", "f8", "f9", "f10", "f12"]
    # a rebound key takes its place in the order
    rebound = [k for k, _, i in effective_keys({"chat.new": "f11"})]
    assert rebound[-3:] == ["f10", "f11", "f12"]


async def test_f1_shows_f5_before_f8_before_f12(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        rows = [s.text for s in app.screen._compositor.render_strips()]
        first = [next(i for i, r in enumerate(rows) if f"│ {k} " in r) for k in ("f5", "f8", "f12")]
        assert first == sorted(first)


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (100, 30)])
@pytest.mark.parametrize("key", ["f1", "f3", "ctrl+l", "f2"])
async def test_dialogs_never_cover_the_bar(make_app, scripted, size, key) -> None:
    app = make_app(scripted(["Hello!"]))
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await reply_done(pilot)
        bar = screen_row(app, app.status)
        await pilot.press(key)
        await wait_until(pilot, lambda: app.screen.id != "_default")
        await pilot.pause()
        box = app.screen.children[0]
        assert box.region.bottom <= app.status.region.y  # bottom: the first row below
        assert not box.region.overlaps(app.status.region)
        assert screen_row(app, app.status) == bar


def test_one_max_tokens_default_for_run_and_chat() -> None:
    run = build_parser().parse_args(["run", "hello"])
    assert run.max_tokens == ChatSettings().max_tokens == DEFAULT_MAX_TOKENS == 1024


def test_prefill_progress_takes_ttfts_place() -> None:
    info = StatusInfo("llamacpp", "smollm2-135m-instruct", "generating", None, None, 812, 8192,
                      None, (1664, 131072), prefilling=(512, 1531))
    assert format_status(info) == (
        "▶ llamacpp · smollm2-135m-instruct │ prefill 512/1531 tok │ – tok/s │ "
        "ctx 812/8192 tok │ cached – tok │ KV 1664/131k tok")
    assert format_status(info, 78) == (
        "▶ smollm2-135m-instruct │ prefill 33% │ – tok/s │ ctx 10% │ cached – │ KV 1%")
