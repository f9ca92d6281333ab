"""`ChatApp`: the Textual chat. Wires widgets, store and a `ChatBackend` together.

Threads: the model loads in a thread worker (it blocks for seconds); everything else runs on
the event loop, including the reply stream, which is an async worker so Esc can cancel it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from tui.backend import BackendError, ChatBackend, ContextFullError, Message, ReplyStream
from tui.chat_actions import ChatActions
from tui.config import ChatConfig
from tui.export import title_from
from tui.keymap import APP_KEYS, bindings, unknown_ids
from tui.settings import ChatSettings
from tui.store import DEFAULT_TITLE, Chat, ChatStore, StoredMessage
from tui.widgets.conversation import Conversation, ErrorView, LoadingView
from tui.widgets.prompt import PromptInput
from tui.widgets.sidebar import ChatList
from tui.widgets.status import StatusBar

STATUS_REFRESH_S = 0.2  # live tok/s refresh period while streaming
QUIT_WAIT_S = 5.0  # longest Ctrl+Q waits for a stopped reply to be stored

_NOTES = {"abort": "stopped", "length": "cut off: max tokens or context reached"}


class ChatApp(ChatActions, App[int]):
    """The chat application.

    Args:
        backend: produces replies; loaded here in a worker thread, closed by the caller.
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
        backend: ChatBackend,
        store: ChatStore,
        config: ChatConfig | None = None,
        *,
        system_prompt: str | None = None,
        config_path: Path | None = None,
    ):
        super().__init__()
        self.backend = backend
        self.store = store
        self.config = config or ChatConfig()
        self.config_path = config_path
        self.chat: Chat | None = None
        self.ready = False  # the backend loaded successfully
        self._system_prompt = system_prompt
        self._reply: ReplyStream | None = None
        self._reply_worker: Worker | None = None
        self._default_model: str | None = None  # what a chat's `model=None` means
        self._failed_model: str | None = None  # don't retry a model that just failed

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
                yield LoadingView(f"Loading {self.backend.model_name} …")
                yield ErrorView("", id="banner")
                yield Conversation(id="conversation")
                yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        theme = self.store.get_pref("theme") or self.config.theme
        if theme in self.available_themes:
            self.theme = theme
        if self.config.keymap:
            self.set_keymap(self.config.keymap)
        self.prompt.set_keys(self.config.keymap)
        self.prompt.accept = self._can_send
        for problem in self.config.problems:
            self.notify(problem, title="config.toml", severity="warning")
        if bad := unknown_ids(self.config.keymap):
            self.notify(f"Unknown binding ids: {', '.join(bad)} (see F1)", severity="warning")
        info = self.status.info
        info.backend, info.model, info.state = self.backend.kind, self.backend.model_name, "loading"
        self.status.refresh_info()
        await self._open_chat(self._initial_chat_id())
        self.query_one(PromptInput).focus()
        self._load_backend()

    def _initial_chat_id(self) -> int:
        if self._system_prompt is None:
            last = self.store.get_pref("last_chat")
            if last is not None and self.store.get_chat(int(last)):
                return int(last)
            chats = self.store.list_chats()
            if chats and not self.store.messages(chats[0].id):
                return chats[0].id  # reuse an empty chat instead of piling up new ones
        return self._create_chat().id

    @work(thread=True, exclusive=True, group="load")
    def _load_backend(self) -> None:
        try:
            self.backend.load()
        except BackendError as exc:
            self.call_from_thread(self._on_load_failed, str(exc))
        except Exception as exc:  # noqa: BLE001 - any load failure must reach the screen
            self.call_from_thread(self._on_load_failed, f"Could not start: {exc!r}")
        else:
            self.call_from_thread(self._on_loaded)

    def _on_loaded(self) -> None:
        self.ready = True
        if self._default_model is None:
            self._default_model = self.backend.model_name
        self.query_one(LoadingView).display = False
        info = self.status.info
        info.backend, info.model, info.state = self.backend.kind, self.backend.model_name, "ready"
        info.context_length = self.backend.context_length
        info.context_tokens = self.backend.count_tokens(self._history())
        info.kv = self.backend.kv_usage()
        self.status.refresh_info()
        self._sync_model()

    def _sync_model(self) -> None:
        """Load the open chat's model if it is not the loaded one (model switching)."""
        if not self.ready or self.busy or self.chat is None:
            return
        wanted = self.chat.settings.model or self._default_model
        if not wanted or wanted in (self.backend.model_name, self._failed_model):
            return
        self.ready = False
        loading = self.query_one(LoadingView)
        loading.set_text(f"Loading {wanted} …")
        loading.display = True
        info = self.status.info
        info.state, info.model = "loading", wanted
        self.status.refresh_info()
        self._switch_model(wanted)

    @work(thread=True, exclusive=True, group="load")
    def _switch_model(self, model: str) -> None:
        try:
            self.backend.switch_model(model)
        except Exception as exc:  # noqa: BLE001 - the old model stays usable; say why
            self.call_from_thread(self._on_switch_failed, model, str(exc))
        else:
            self._failed_model = None
            self.call_from_thread(self._on_loaded)

    def _on_switch_failed(self, model: str, message: str) -> None:
        self._failed_model = model
        self.notify(
            f"{message}\nStaying on {self.backend.model_name}.",
            title=f"Could not load {model}", severity="error", timeout=10,
        )
        self._on_loaded()

    def _on_load_failed(self, message: str) -> None:
        self.query_one(LoadingView).display = False
        banner = self.query_one("#banner", ErrorView)
        banner.update(f"{message}\nPast chats stay readable; quit with ctrl+q.")
        banner.display = True
        self.status.info.state = "error"
        self.status.refresh_info()

    # -- helpers ----------------------------------------------------------------------------

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
    def busy(self) -> bool:
        """A reply is streaming."""
        return self._reply_worker is not None and self._reply_worker.is_running

    def key_for(self, binding_id: str) -> str:
        """The key currently bound to `binding_id` (after config overrides), for hints."""
        if binding_id in self.config.keymap:
            return self.config.keymap[binding_id]
        return next(s.keys for s in APP_KEYS if s.id == binding_id)

    def _create_chat(self) -> Chat:
        settings = ChatSettings.from_dict(self.config.defaults.to_dict())
        if self._system_prompt is not None:
            settings.system_prompt = self._system_prompt
        return self.store.create_chat(DEFAULT_TITLE, settings)

    def _history(self, chat: Chat | None = None) -> list[Message]:
        """The conversation as chat-template messages; the whole history goes every turn,
        and the engine's prefix cache makes the already-seen part nearly free."""
        chat = chat or self.chat
        if chat is None:
            return []
        messages: list[Message] = []
        if chat.settings.system_prompt:
            messages.append({"role": "system", "content": chat.settings.system_prompt})
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(chat.id)]
        return messages

    async def _open_chat(self, chat_id: int) -> None:
        self.chat = self.store.get_chat(chat_id)
        self.store.set_pref("last_chat", str(chat_id))
        messages = self.store.messages(chat_id)
        await self.conversation.show(
            [(m.role, m.content, _NOTES.get(m.meta.get("finish_reason"), ""), m.id) for m in messages]
        )
        self._refresh_sidebar()
        self._show_chat_stats(messages)
        self._sync_model()

    def _refresh_sidebar(self) -> None:
        self.query_one(ChatList).set_chats(self.store.list_chats(), self.chat.id if self.chat else None)

    def _show_chat_stats(self, messages: list[StoredMessage]) -> None:
        """Status numbers for an opened chat: those of its last reply."""
        info = self.status.info
        last = next((m for m in reversed(messages) if m.role == "assistant"), None)
        meta = last.meta if last else {}
        info.ttft_s = meta.get("ttft_s")
        info.decode_tok_s = meta.get("decode_tok_s")
        info.cached_tokens = meta.get("cached_tokens")
        info.context_tokens = (
            self.backend.count_tokens(self._history()) if self.ready else meta.get("context_tokens")
        )
        self.status.refresh_info()

    def _after_reply_stops(self, then: Callable[[], Awaitable[Any]]) -> None:
        """Stop a streaming reply, then run `then` (in a worker: waiting for the reply worker
        inside a message handler would block the handler that the worker may need)."""

        async def run() -> None:
            worker = self._reply_worker
            if self._reply is not None:
                self._reply.cancel()
            if worker is not None and worker.is_running:
                try:
                    await worker.wait()
                except (WorkerCancelled, WorkerFailed):
                    pass
            await then()

        self.run_worker(run(), group="ui")

    def _refuse_while_busy(self) -> bool:
        if self.busy:
            self.notify(f"A reply is streaming; {self.key_for('reply.stop')} stops it.")
            return True
        return False

    # -- sending and streaming --------------------------------------------------------------

    def _can_send(self, text: str) -> bool:
        """Whether the prompt may send `text` now; says why not."""
        if not text.strip() or self._refuse_while_busy():
            return False
        if not self.ready:
            self.notify("The model is not ready yet.", severity="warning")
            return False
        return True

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not self._can_send(text):  # state may have changed since the key press
            self.prompt.text = event.text
            return
        assert self.chat is not None
        if self.chat.title == DEFAULT_TITLE and not self.store.messages(self.chat.id):
            self.chat.title = title_from(text)
            self.store.rename_chat(self.chat.id, self.chat.title)
        message = self.store.add_message(self.chat.id, "user", text)
        self._refresh_sidebar()
        await self.conversation.clear_errors()
        await self.conversation.add("user", text, message.id)
        self._start_reply()

    def _start_reply(self) -> None:
        assert self.chat is not None
        self._reply_worker = self.run_worker(
            self._generate(self.chat), group="reply", exclusive=True
        )

    async def _generate(self, chat: Chat) -> None:
        """Stream one reply into a new MessageView and store it (partial if stopped)."""
        try:
            reply = self.backend.start_reply(self._history(chat), chat.settings)
        except ContextFullError as exc:
            if exc.prompt_tokens is not None:
                self.status.info.context_tokens = exc.prompt_tokens
                self.status.refresh_info()
            await self.conversation.show_error(
                f"{exc}\nStart a new chat ({self.key_for('chat.new')}) or drop the oldest "
                f"turn ({self.key_for('chat.trim')}) and regenerate ({self.key_for('reply.regenerate')})."
            )
            return
        except BackendError as exc:
            await self.conversation.show_error(str(exc))
            return
        self._reply = reply
        info = self.status.info
        info.state, info.ttft_s, info.decode_tok_s, info.cached_tokens = "generating", None, None, None
        self.status.refresh_info()
        view = await self.conversation.add("assistant")
        view.start_stream()
        error: BackendError | None = None
        next_refresh = 0.0
        try:
            async for chunk in reply:
                await view.append(chunk)
                if (now := time.monotonic()) >= next_refresh:
                    next_refresh = now + STATUS_REFRESH_S
                    self._show_live(reply)
        except BackendError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - a failed reply must not take the app down
            error = BackendError(f"The reply failed: {exc!r}")
        finally:
            self._reply = None
        stats = reply.stats
        note = _NOTES.get(stats.finish_reason or "", "")
        if error is not None:
            note = "error"
        await view.finish(note)
        if view.text or error is None:
            meta = {
                "finish_reason": stats.finish_reason,
                "ttft_s": stats.ttft_s,
                "decode_tok_s": stats.decode_tok_s or reply.live_decode_tok_s(),
                "prompt_tokens": stats.prompt_tokens,
                "completion_tokens": stats.completion_tokens,
                "cached_tokens": stats.cached_tokens,
                "context_tokens": stats.context_tokens,
                "model": self.backend.model_name,
            }
            stored = self.store.add_message(chat.id, "assistant", view.text, meta)
            view.message_id = stored.id
        else:
            await view.remove()
        if error is not None:
            await self.conversation.show_error(str(error))
        info.state = "ready"
        info.ttft_s = stats.ttft_s
        info.decode_tok_s = stats.decode_tok_s or reply.live_decode_tok_s()
        info.cached_tokens = stats.cached_tokens
        info.context_tokens = stats.context_tokens
        info.kv = self.backend.kv_usage()
        self.status.refresh_info()
        self._reply_worker = None  # so the model check below does not see this reply as busy
        self._sync_model()

    def _show_live(self, reply: ReplyStream) -> None:
        info = self.status.info
        info.ttft_s = reply.stats.ttft_s
        info.decode_tok_s = reply.live_decode_tok_s()
        if reply.stats.prompt_tokens is not None:
            info.context_tokens = reply.stats.prompt_tokens + reply.stats.completion_tokens
        info.kv = self.backend.kv_usage()
        self.status.refresh_info()

    # -- actions ----------------------------------------------------------------------------

    def action_stop_reply(self) -> None:
        """Esc: cancel the engine request; the partial reply is kept and marked stopped."""
        if self._reply is not None:
            self._reply.cancel()

    def action_interrupt(self) -> None:
        """Ctrl+C: stop a streaming reply; otherwise copy a selection or quit."""
        if self._reply is not None:
            self._reply.cancel()
        elif self.focused is self.prompt and self.prompt.selected_text:
            self.prompt.action_copy()
        else:
            self.exit(0)

    async def action_quit(self) -> None:
        """Ctrl+Q: a streaming reply is stopped and stored (partial, marked stopped) first."""
        if self._reply is not None:
            self._reply.cancel()
            worker = self._reply_worker
            if worker is not None:
                try:  # bounded: a backend that never ends its stream must not block quitting
                    await asyncio.wait_for(worker.wait(), QUIT_WAIT_S)
                except (TimeoutError, WorkerFailed, WorkerCancelled):
                    pass
        self.exit(0)

    def action_new_chat(self) -> None:
        async def new() -> None:
            await self._open_chat(self._create_chat().id)
            self.prompt.focus()

        self._after_reply_stops(new)

    async def on_chat_list_chat_chosen(self, event: ChatList.ChatChosen) -> None:
        if self.chat is not None and event.chat_id == self.chat.id:
            return

        async def switch() -> None:
            await self._open_chat(event.chat_id)

        self._after_reply_stops(switch)

    async def action_regenerate(self) -> None:
        """Drop the last reply (if any) and generate a new one for the same history."""
        if self._refuse_while_busy() or self.chat is None:
            return
        if not self.ready:
            self.notify("The model is not ready yet.", severity="warning")
            return
        messages = self.store.messages(self.chat.id)
        if messages and messages[-1].role == "assistant":
            self.store.delete_message(messages[-1].id)
            views = self.conversation.messages()
            if views and views[-1].role == "assistant":
                await views[-1].remove()
            messages.pop()
        if not messages or messages[-1].role != "user":
            self.notify("Nothing to regenerate.")
            return
        await self.conversation.clear_errors()
        self._start_reply()

    async def action_edit_last(self) -> None:
        """Move the last user message (and what followed it) back into the input."""
        if self._refuse_while_busy() or self.chat is None:
            return
        messages = self.store.messages(self.chat.id)
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        if last_user is None:
            self.notify("No message to edit.")
            return
        self.store.delete_messages_from(self.chat.id, last_user.id)
        await self._open_chat(self.chat.id)
        self.prompt.text = last_user.content
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()
