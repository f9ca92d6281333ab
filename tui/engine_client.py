"""`ChatClient` over the in-process `AsyncEngine` (the default for `tandem chat`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from app.engine.types import (
    EngineOverloadedError,
    PromptTooLongError,
    SamplingParams,
)
from app.prompts import chat_prompt_ids
from models.chat_template import ChatTemplateError, TemplateRaised
from tui.chat_settings import ChatSettings
from tui.client import ChatClient, ClientError, ContextFullError, Message, ReplyStream

EngineFactory = Callable[[str], Any]  # model name or path -> AsyncEngine


def engine_factory(base: Any = None) -> EngineFactory:
    """A factory loading `model` with the engine settings of `base` (an `app.config.
    EngineArgs`; None: the defaults) through `app.loader.load_engine`."""

    def load(model: str) -> Any:
        # Imported here so the UI (and its tests) never pay for the engine unless it is used.
        from dataclasses import replace

        from app.config import EngineArgs
        from app.loader import load_engine

        # No download inside the TUI (its progress bar would have nowhere to go): a missing
        # registry model raises ModelNotFoundError with the `tandem models pull` hint.
        return load_engine(replace(base or EngineArgs(), model=model), pull_missing=False)

    return load


def to_sampling_params(settings: ChatSettings) -> SamplingParams:
    """Map per-chat settings onto engine sampling parameters."""
    return SamplingParams(
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        min_p=settings.min_p,
        seed=settings.seed,
        repetition_penalty=settings.repetition_penalty,
    )


class EngineClient(ChatClient):
    """Runs the engine in this process; every turn resends the whole conversation through
    the chat template and relies on the engine's prefix cache to skip the shared prefix.

    Args:
        model: registry name or GGUF path passed to the factory.
        factory: builds the engine (default `engine_factory()`: `app.loader.load_engine`
            with default settings); tests pass one over a scripted runner.
        models: names offered for switching (default: registry models in the store).
    """

    def __init__(
        self, model: str, factory: EngineFactory | None = None, models: list[str] | None = None
    ):
        self.model_name = model
        self.kind = "engine"
        self._factory = factory or engine_factory()
        self._models = models
        self.engine: Any = None

    def load(self) -> None:
        from models.errors import ModelStoreError

        try:
            engine = self._factory(self.model_name)
        except (FileNotFoundError, ModelStoreError) as exc:
            raise ClientError(
                f"Model not found: {exc}\nFetch a registry model with `tandem models pull NAME` "
                "(see `tandem models`) or pass --model PATH.gguf."
            ) from exc
        except (ValueError, OSError, RuntimeError) as exc:
            raise ClientError(f"Could not load model {self.model_name}: {exc}") from exc
        self.engine = engine
        self.kind = engine.backend_name
        self.model_name = engine.model_name
        self.context_length = engine.context_length

    def available_models(self) -> list[str]:
        """The loaded model, then registry models already in the store."""
        if self._models is not None:
            candidates = self._models
        else:
            from models.registry import MODELS
            from models.store import is_present

            candidates = [n for n in MODELS if is_present(n)]
        return [self.model_name] + [n for n in candidates if n != self.model_name]

    def switch_model(self, model: str) -> None:
        # Load the new engine before freeing the old one, so a failed load (missing file,
        # out of memory) leaves the chat working on the current model.
        replacement = EngineClient(model, self._factory, self._models)
        replacement.load()
        old = self.engine
        self.engine = replacement.engine
        self.kind, self.model_name = replacement.kind, replacement.model_name
        self.context_length = replacement.context_length
        if old is not None:
            old.shutdown()

    def count_tokens(self, messages: list[Message]) -> int | None:
        if self.engine is None:
            return None
        if not messages:
            return 0  # templates may add a default system turn; nothing is in context yet
        try:
            return len(chat_prompt_ids(self.engine.tokenizer, messages))
        except ChatTemplateError:
            return None  # start_reply reports it

    def start_reply(self, messages: list[Message], settings: ChatSettings) -> ReplyStream:
        if self.engine is None:
            raise ClientError("The model is not loaded yet.")
        try:
            prompt = chat_prompt_ids(self.engine.tokenizer, messages)
        except TemplateRaised as exc:  # the template refused these messages, in its words
            raise ClientError(f"The model's chat template refused the conversation: "
                              f"{exc.message}") from exc
        except ChatTemplateError as exc:
            raise ClientError(f"The model's chat template failed: {exc}") from exc
        try:
            stream = self.engine.submit(prompt, to_sampling_params(settings))
        except PromptTooLongError as exc:
            raise ContextFullError(exc.prompt_tokens, exc.context_length) from exc
        except EngineOverloadedError as exc:
            raise ClientError(f"The engine is busy: {exc}") from exc
        except ValueError as exc:
            raise ClientError(f"Invalid settings: {exc}") from exc
        return _EngineReply(stream, len(prompt), self.engine)

    def kv_usage(self) -> tuple[int, int] | None:
        if self.engine is None:
            return None
        stats = self.engine.stats()
        block = self.engine.runner.block_size  # tokens per KV block
        return stats.kv_blocks_used * block, stats.kv_blocks_total * block

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class _EngineReply(ReplyStream):
    """Adapts an engine request stream to `ReplyStream`."""

    def __init__(self, stream: Any, prompt_tokens: int, engine: Any):
        super().__init__(prompt_tokens)
        self._stream = stream
        self._engine = engine
        self._finished = False

    async def _chunks(self) -> AsyncIterator[str]:
        try:
            async for out in self._stream:
                self._count(len(out.token_ids))
                if out.text:
                    yield out.text
                if out.finished:
                    self._finished = True
                    self._finish(out.finish_reason, out.metrics)
                    return
        finally:
            # The consumer stopped early (task cancelled): free the engine's slot and blocks.
            if not self._finished:
                self._stream.cancel()
                self.stats.finish_reason = "abort"

    def _finish(self, reason: str | None, metrics: Any) -> None:
        self.stats.finish_reason = reason
        if metrics is None:
            return
        # The engine's own timestamps are more exact than ours; prefer them.
        self.stats.prompt_tokens = metrics.prompt_tokens
        self.stats.completion_tokens = metrics.completion_tokens
        self.stats.cached_tokens = metrics.cached_tokens
        self.stats.draft_tokens = metrics.num_draft_tokens
        self.stats.accepted_tokens = metrics.num_accepted_tokens
        self.stats.prefill_route = metrics.remote_prefill
        if metrics.ttft is not None:
            self.stats.ttft_s = metrics.ttft
        if metrics.decode_tok_s is not None:
            self.stats.decode_tok_s = metrics.decode_tok_s

    def prefill_progress(self) -> tuple[int, int] | None:
        p = self._engine.prefill_progress(self._stream.request_id)
        return None if p is None else (p.computed, p.total)

    def cancel(self) -> None:
        self._stream.cancel()
