"""`ChatApp`: the Textual chat. Wires widgets, a `ChatSession` and a `ChatClient` together.

Threads: the model loads in a thread worker (it blocks for seconds); everything else runs on
the event loop, including the reply stream, which is an async worker so Esc can cancel it.
What the keys do lives in `actions.py`; chat state in `session.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from app.disagg.report import route_summary
from tui.actions import ChatActions, can_send, open_chat
from tui.client import ChatClient, ClientError, ContextFullError, ReplyStream
from tui.config import ChatConfig
from tui.keymap import APP_KEYS, bindings, key_for, unknown_ids
from tui.session import ChatSession
from tui.store import Chat, ChatStore
from tui.widgets.conversation import FINISH_NOTES, Conversation, ErrorView, LoadingView
from tui.widgets.prompt import PromptInput
from tui.widgets.sidebar import ChatList
from tui.widgets.status import StatusBar

STATUS_REFRESH_S = 0.2  # live tok/s refresh period while streaming


class ChatApp(ChatActions, App[int]):
    """The chat application.

    Args:
        client: produces replies; loaded here in a worker thread, closed by the caller.
        store: chat database (the caller opens and closes it).
        config: parsed config file (keymap, theme, defaults, export dir).
        system_prompt: if given, start a new chat with this system prompt (`--system`).
        config_path: shown in the help screen.
    """

    TITLE = "tandem chat"
    BINDINGS = bindings(APP_KEYS)
    CSS = """
    #main { height: 1fr; }
    #body { width: 1fr; }
    #banner { display: none; }
    """

    def __init__(
        self,
        client: ChatClient,
        store: ChatStore,
        config: ChatConfig | None = None,
        *,
        system_prompt: str | None = None,
        config_path: Path | None = None,
    ):
        super().__init__()
        self.client = client
        self.config = config or ChatConfig()
        self.config_path = config_path
        self.session = ChatSession(store, self.config.defaults, system_prompt)
        self.ready = False  # the client loaded successfully
        self._reply: ReplyStream | None = None
        self._reply_worker: Worker | None = None

    # -- layout and start-up ----------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Any:
        """The command palette (ctrl+p) offers every chat action next to Textual's own."""
        yield from super().get_system_commands(screen)
        for spec in APP_KEYS:
            if spec.action not in ("quit", "interrupt", "help"):
                action = getattr(self, f"action_{spec.action}")
                yield SystemCommand(spec.description, self.key_for(spec.id), action)

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield ChatList(id="sidebar")
            with Vertical(id="body"):
                yield LoadingView(f"Loading {self.client.model_name} …")
                yield ErrorView("", id="banner")
                yield Conversation(id="conversation")
                yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        theme = self.session.saved_theme() or self.config.theme
        if theme in self.available_themes:
            self.theme = theme
        if self.config.keymap:
            self.set_keymap(self.config.keymap)
        self.prompt.set_keys(self.config.keymap)
        self.prompt.accept = partial(can_send, self)
        for problem in self.config.problems:
            self.notify(problem, title="config.toml", severity="warning")
        if bad := unknown_ids(self.config.keymap):
            self.notify(f"Unknown binding ids: {', '.join(bad)} (see F1)", severity="warning")
        self.status.update(backend=self.client.kind, model=self.client.model_name, state="loading")
        await open_chat(self, self.session.initial_chat_id())
        self.prompt.focus()
        self._load_client()

    @work(thread=True, exclusive=True, group="load")
    def _load_client(self) -> None:
        try:
            self.client.load()
        except ClientError as exc:
            self.call_from_thread(self._on_load_failed, str(exc))
        except Exception as exc:  # noqa: BLE001 - any load failure must reach the screen
            self.call_from_thread(self._on_load_failed, f"Could not start: {exc!r}")
        else:
            self.call_from_thread(self._on_loaded)

    def _on_loaded(self) -> None:
        self.ready = True
        if self.session.default_model is None:
            self.session.default_model = self.client.model_name
        self.query_one(LoadingView).display = False
        self.status.update(
            backend=self.client.kind, model=self.client.model_name, state="ready",
            context_length=self.client.context_length,
            context_tokens=self.client.count_tokens(self.session.history()),
            kv=self.client.kv_usage(),
        )
        self.sync_model()

    def sync_model(self) -> None:
        """Load the open chat's model if it is not the loaded one (model switching)."""
        if not self.ready or self.busy:
            return
        wanted = self.session.wanted_model(self.client.model_name)
        if wanted is None:
            return
        self.ready = False
        loading = self.query_one(LoadingView)
        loading.set_text(f"Loading {wanted} …")
        loading.display = True
        self.status.update(state="loading", model=wanted)
        self._switch_model(wanted)

    @work(thread=True, exclusive=True, group="load")
    def _switch_model(self, model: str) -> None:
        try:
            self.client.switch_model(model)
        except Exception as exc:  # noqa: BLE001 - the old model stays usable; say why
            self.call_from_thread(self._on_switch_failed, model, str(exc))
        else:
            self.session.failed_model = None
            self.call_from_thread(self._on_loaded)

    def _on_switch_failed(self, model: str, message: str) -> None:
        self.session.failed_model = model
        self.notify(
            f"{message}\nStaying on {self.client.model_name}.",
            title=f"Could not load {model}", severity="error", timeout=10,
        )
        self._on_loaded()

    def _on_load_failed(self, message: str) -> None:
        self.query_one(LoadingView).display = False
        banner = self.query_one("#banner", ErrorView)
        banner.update(f"{message}\nPast chats stay readable; quit with ctrl+q.")
        banner.display = True
        self.status.update(state="error")

    # -- what `ChatActions` uses (see `ChatHost`) ------------------------------------------

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def conversation(self) -> Conversation:
        return self.query_one(Conversation)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def sidebar(self) -> ChatList:
        return self.query_one(ChatList)

    @property
    def busy(self) -> bool:
        """A reply is streaming."""
        return self._reply_worker is not None and self._reply_worker.is_running

    def key_for(self, binding_id: str) -> str:
        """The key currently bound to `binding_id` (after config overrides), for hints."""
        return key_for(self.config.keymap, binding_id)

    def cancel_reply(self) -> bool:
        """Cancel the streaming reply (kept, marked stopped); False if none was streaming."""
        if self._reply is None:
            return False
        self._reply.cancel()
        return True

    async def stop_reply(self, timeout: float | None = None) -> None:
        """Cancel the streaming reply and wait (up to `timeout` s) until it is stored."""
        self.cancel_reply()
        worker = self._reply_worker
        if worker is not None and worker.is_running:
            try:  # bounded: a client that never ends its stream must not block quitting
                await asyncio.wait_for(worker.wait(), timeout)
            except (TimeoutError, WorkerCancelled, WorkerFailed):
                pass

    def after_reply_stops(self, then: Callable[[], Awaitable[Any]]) -> None:
        """Stop a streaming reply, then run `then` (in a worker: waiting for the reply worker
        inside a message handler would block the handler that the worker may need)."""

        async def run() -> None:
            await self.stop_reply()
            await then()

        self.run_worker(run(), group="ui")

    # -- streaming --------------------------------------------------------------------------

    def start_reply(self) -> None:
        """Stream a reply to the open chat's history in the (cancellable) reply worker."""
        assert self.session.chat is not None
        self._reply_worker = self.run_worker(
            self._generate(self.session.chat), group="reply", exclusive=True
        )

    async def _generate(self, chat: Chat) -> None:
        """Stream one reply into a new MessageView and store it (partial if stopped)."""
        try:
            reply = self.client.start_reply(self.session.history(chat), chat.settings)
        except ContextFullError as exc:
            if exc.prompt_tokens is not None:
                self.status.update(context_tokens=exc.prompt_tokens)
            await self.conversation.show_error(
                f"{exc}\nStart a new chat ({self.key_for('chat.new')}) or drop the oldest "
                f"turn ({self.key_for('chat.trim')}) and regenerate ({self.key_for('reply.regenerate')})."
            )
            return
        except ClientError as exc:
            await self.conversation.show_error(str(exc))
            return
        self._reply = reply
        self.status.update(state="generating", ttft_s=None, decode_tok_s=None, cached_tokens=None)
        view = await self.conversation.add("assistant")
        view.start_stream()
        error: ClientError | None = None
        next_refresh = 0.0
        # the prompt's prefill progress in TTFT's place until the first token
        prefill_timer: Timer | None = self.set_interval(
            STATUS_REFRESH_S, lambda: self.status.update(prefilling=reply.prefill_progress()))
        try:
            async for chunk in reply:
                if prefill_timer is not None:
                    prefill_timer.stop()
                    prefill_timer = None
                    self.status.update(prefilling=None)
                await view.append(chunk)
                if (now := time.monotonic()) >= next_refresh:
                    next_refresh = now + STATUS_REFRESH_S
                    self._show_live(reply)
        except ClientError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - a failed reply must not take the app down
            error = ClientError(f"The reply failed: {exc!r}")
        finally:
            self._reply = None
            if prefill_timer is not None:
                prefill_timer.stop()
        stats = reply.stats
        note = "error" if error is not None else FINISH_NOTES.get(stats.finish_reason or "", "")
        await view.finish(note)
        if view.text or error is None:
            view.message_id = self.session.add_reply(chat, view.text, reply, self.client.model_name).id
        else:
            await view.remove()
        if error is not None:
            await self.conversation.show_error(str(error))
        self.status.update(
            state="ready", ttft_s=stats.ttft_s, prefilling=None,
            decode_tok_s=stats.decode_tok_s or reply.live_decode_tok_s(),
            cached_tokens=stats.cached_tokens, context_tokens=stats.context_tokens,
            kv=self.client.kv_usage(),
            spec=(stats.accepted_tokens, stats.draft_tokens) if stats.draft_tokens else None,
            # two-box mode: only a remote prefill is news
            prefill=route_summary(stats.prefill_route)
            if stats.prefill_route and stats.prefill_route["remote"] else None,
        )
        self._reply_worker = None  # so the model check below does not see this reply as busy
        self.sync_model()

    def _show_live(self, reply: ReplyStream) -> None:
        stats = reply.stats
        live: dict[str, Any] = {"ttft_s": stats.ttft_s, "decode_tok_s": reply.live_decode_tok_s()}
        if stats.prompt_tokens is not None:
            live["context_tokens"] = stats.prompt_tokens + stats.completion_tokens
        self.status.update(**live, kv=self.client.kv_usage())
