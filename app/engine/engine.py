"""The synchronous engine: one `step()` = schedule, execute on the runner, sample, stream.

Single-threaded by design; `AsyncEngine` drives it from its own thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.engine.block_manager import BlockManager
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.request import Request, RequestStatus
from app.engine.sampler import make_rng, sample
from app.engine.scheduler import Scheduler, SchedulerConfig
from app.engine.slots import SlotPool
from app.engine.types import (
    EngineStats,
    PromptTooLongError,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from backends.base import BatchItem, Runner


@dataclass(slots=True)
class EngineConfig:
    """Args:
    context_length: most tokens (prompt + output) one sequence may hold.
    scheduler: batching limits.
    enable_prefix_caching: reuse cached prompt blocks.
    """

    context_length: int = 8192
    scheduler: SchedulerConfig | None = None
    enable_prefix_caching: bool = True


class LLMEngine:
    """Drives a runner. Not thread-safe: call from one thread.

    Raises (from `add_request`): PromptTooLongError, ValueError for empty or
    out-of-vocabulary prompts.
    """

    def __init__(self, runner: Runner, config: EngineConfig | None = None):
        self.runner = runner
        self.config = config or EngineConfig()
        sched_cfg = self.config.scheduler or SchedulerConfig()
        self.context_length = min(self.config.context_length, runner.info.n_ctx_train,
                                  runner.max_seq_tokens)
        self.block_manager = BlockManager(
            runner.num_blocks,
            runner.block_size,
            enable_prefix_caching=self.config.enable_prefix_caching,
            on_evict=runner.evict,
        )
        self.slots = SlotPool(runner.max_seqs)
        self.scheduler = Scheduler(
            sched_cfg, self.block_manager, self.slots, runner.share_blocks, runner.release
        )
        self.requests: dict[str, Request] = {}
        self.eos_ids = set(runner.tokenizer.eos_ids)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0

    # -- requests --------------------------------------------------------------------------

    def validate(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise PromptTooLongError(len(prompt_ids), self.context_length)
        n_vocab = self.runner.info.n_vocab
        if any(not 0 <= t < n_vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {n_vocab})")

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> Request:
        self.validate(prompt_ids)
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        request = Request(request_id, list(prompt_ids), params)
        if arrival_time is not None:
            request.metrics.arrival_time = arrival_time
        request.rng = make_rng(params.seed)
        request.detokenizer = IncrementalDetokenizer(self.runner.tokenizer.token_bytes, params.stop)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its blocks are freed. Returns its final output, if it existed."""
        request = self.requests.get(request_id)
        if request is None or request.finished:
            return None
        self._finish(request, "abort")
        return self._output(request, "", [], None)

    # -- the step --------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the outputs it produced (one per sampled request)."""
        sched = self.scheduler.schedule()
        if not sched:
            return []
        now = time.perf_counter()
        items: list[BatchItem] = []
        sampled: list[Request] = []
        for request, num_new in sched.num_scheduled_tokens.items():
            start = request.num_computed_tokens
            end = start + num_new
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
            wants_logits = end == request.num_tokens
            items.append(BatchItem(
                slot=request.slot,
                tokens=request.token_ids[start:end],
                start_pos=start,
                block_table=request.block_table,
                logits_indices=[num_new - 1] if wants_logits else [],
            ))
            if wants_logits:
                sampled.append(request)
        logits = self.runner.execute(items)
        for request, num_new in sched.num_scheduled_tokens.items():
            request.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(request, request.num_computed_tokens)
        if not sampled:
            return []
        result = sample(
            logits,
            [r.params for r in sampled],
            [r.prompt_ids for r in sampled],
            [r.output_ids for r in sampled],
            [r.rng for r in sampled],
        )
        now = time.perf_counter()
        outputs = []
        for row, request in enumerate(sampled):
            token = int(result.token_ids[row])
            lp = result.logprobs[row] if result.logprobs else None
            outputs.append(self._append_token(request, token, lp, now))
        return outputs

    def _append_token(self, request: Request, token: int, lp, now: float) -> RequestOutput:
        params = request.params
        request.token_ids.append(token)
        self.generation_tokens_total += 1
        metrics = request.metrics
        metrics.completion_tokens += 1
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            self.prompt_tokens_total += request.num_prompt_tokens
        is_eos = (token in self.eos_ids and not params.ignore_eos) or token in params.stop_token_ids
        text = "" if is_eos else request.detokenizer.push(token)
        reason = None
        if is_eos or request.detokenizer.stopped:
            reason = "stop"
        elif params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
            reason = "length"
        elif request.num_tokens >= self.context_length:
            reason = "length"
        logprobs = None
        if lp is not None:
            logprobs = [self._token_logprob(token, lp)]
        if reason is not None:
            if not request.detokenizer.stopped:
                text += request.detokenizer.flush()
            metrics.finish_time = now
            self._finish(request, reason)
        return self._output(request, text, [token], logprobs)

    def _token_logprob(self, token: int, lp) -> TokenLogprob:
        tok = self.runner.tokenizer
        chosen, top = lp
        text = tok.token_bytes(token).decode("utf-8", errors="replace")
        return TokenLogprob(
            token_id=token,
            token=text,
            logprob=float(chosen),
            top=[(t, tok.token_bytes(t).decode("utf-8", errors="replace"), float(v)) for t, v in top],
        )

    def _finish(self, request: Request, reason: str) -> None:
        if request.metrics.finish_time is None:
            request.metrics.finish_time = time.perf_counter()
        self.scheduler.finish(request, reason)
        self.requests.pop(request.request_id, None)
        self.requests_finished += 1

    def _output(self, request, text, token_ids, logprobs) -> RequestOutput:
        finished = request.status is RequestStatus.FINISHED
        return RequestOutput(
            request_id=request.request_id,
            text=text,
            token_ids=token_ids,
            finished=finished,
            finish_reason=request.finish_reason if finished else None,
            logprobs=logprobs,
            metrics=request.metrics,
        )

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used_blocks,
            prefix_cache_hit_tokens=bm.hit_tokens_total,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            requests_finished=self.requests_finished,
        )
