"""The synchronous engine. One step is a pipeline:

    plan (scheduler) -> build batch -> execute (runner) -> sample / verify -> commit
                                       + grammar masks, filled beside it on a worker thread

`commit` is the only place that changes a request's counters: it advances
`num_computed_tokens`, rolls back drafted positions the target rejected (block manager
`shrink` + runner `truncate`), appends the accepted tokens one at a time through the same
stop / EOS / length checks, stopping at the first that ends the request, and only then
registers full blocks of verified tokens in the prefix cache (vLLM v1's
`update_from_output`): a prefill chunk's at once, decoded ones `DECODE_HASH_BATCH_TOKENS` at a
time and the rest when the request leaves its slot.

Single-threaded by design; `AsyncEngine` drives it from its own thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from app.engine.block_manager import BlockManager
from app.engine.config import EngineConfig, SchedulerConfig
from app.engine.constrain import GrammarCompiler
from app.engine.constrain.mask import MaskRequest, apply_masks
from app.engine.constrain.pipeline import MaskPipeline, MaskStats, PendingMasks, spare_core
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.remote_prefill import RemoteOutcome, RemotePrefill
from app.engine.request import Request, RequestStatus
from app.engine.sampler import distribution, position_rng, sample, seed_key
from app.engine.scheduler import Scheduler, SchedulerOutput
from app.engine.slots import SlotPool
from app.engine.spec_decode.draft_model import PENDING
from app.engine.spec_decode.speculator import Speculator
from app.engine.spec_decode.verify import rejection_sample
from app.engine.types import (
    EngineStats,
    PromptTooLongError,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from backends.base import BatchItem, KVResidency, LayerKV, Runner

__all__ = ["EngineConfig", "LLMEngine", "SchedulerConfig", "StepResult"]

# Decoded tokens enter the prefix cache this many at a time, and the rest when the request
# ends or is preempted (`Scheduler._free`); a prompt's blocks enter it as soon as computed,
# for the requests waiting to share them. With one-token blocks a hash call per decoded token
# is a measurable part of a step at one user (README, Benchmarks).
DECODE_HASH_BATCH_TOKENS = 16

# (token id, (chosen logprob, top list) or None): one sampled position
Sampled = tuple[int, tuple[float, list[tuple[int, float]]] | None]


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a planned step.

    Positions `start .. start+num_tokens-1` are computed; the last `num_drafts` of them are
    drafts. Logits rows `first_row .. first_row+num_rows-1` belong to it (`num_rows` is 0 for
    a prefill chunk that does not reach the prompt's end, else `num_drafts + 1`).
    """

    request: Request
    start: int
    num_tokens: int
    num_drafts: int
    first_row: int
    num_rows: int


@dataclass(slots=True)
class StepPlan:
    """The batch handed to the runner and, per request, where its part of the result is."""

    items: list[BatchItem] = field(default_factory=list)
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_rows: int = 0


@dataclass(slots=True)
class StepResult:
    """What a step did: stream outputs (one per request that produced tokens) and, per
    request id, the positions whose KV the step committed (verified)."""

    outputs: list[RequestOutput] = field(default_factory=list)
    computed: dict[str, range] = field(default_factory=dict)


class LLMEngine:
    """Drives a runner. Not thread-safe: call from one thread.

    Args:
        runner: the target model's runner.
        config: limits and switches.
        residency: who receives KV-residency calls (default: the runner itself; a composite
            when a draft model's runner must mirror the target's slots).
        speculator: proposes drafts before each step (None: no speculative decoding).
    Raises ValueError if a speculator is given for a runner that cannot truncate exactly;
    (from `add_request`) PromptTooLongError, ValueError for empty or out-of-vocabulary
    prompts.
    """

    def __init__(self, runner: Runner, config: EngineConfig | None = None,
                 residency: KVResidency | None = None, speculator: Speculator | None = None):
        if speculator is not None and not runner.capabilities.exact_truncate:
            raise ValueError("speculative decoding needs a runner that truncates exactly")
        self.runner = runner
        self.speculator = speculator
        self.config = config or EngineConfig()
        self.residency: KVResidency = residency or runner
        self.context_length = min(self.config.context_length, runner.info.n_ctx_train,
                                  runner.max_seq_tokens)
        self.block_manager = BlockManager(
            runner.num_blocks,
            runner.block_size,
            enable_prefix_caching=self.config.enable_prefix_caching,
            on_evict=self.residency.evict,
        )
        self.slots = SlotPool(runner.max_seqs)
        sched = self.config.scheduler
        if sched.max_num_seqs > runner.max_seqs:  # the runner gave fewer slots (KV budget)
            sched = replace(sched, max_num_seqs=runner.max_seqs)
        self.scheduler = Scheduler(sched, self.block_manager, self.slots, self.residency)
        self.requests: dict[str, Request] = {}
        self.eos_ids = set(runner.tokenizer.eos_ids)
        # compiles response formats for this model (`SamplingParams.grammar`); the
        # vocabulary view is built on first use
        self.grammars = GrammarCompiler(runner.tokenizer, runner.info.n_vocab)
        # masks are filled on a worker thread while the runner computes the step, where a
        # core is left over: llama.cpp's workers spin at barriers, and a thread taking one
        # of their cores stalls the whole step
        self.masks = MaskPipeline(overlap=spare_core(runner))
        self.mask_stats = MaskStats()
        self.constrained_requests = 0  # requests added with a grammar
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
        request.seed_key = seed_key(params.seed)
        request.detokenizer = IncrementalDetokenizer(self.runner.tokenizer.token_bytes, params.stop)
        if params.grammar is not None:
            request.matcher = params.grammar.matcher()
            self.constrained_requests += 1
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

    # -- remote prefill (two-box mode; app/engine/remote_prefill.py) ------------------------

    def set_remote_prefill(self, remote: RemotePrefill) -> None:
        """Attach a prefill peer. Raises ValueError if the runner cannot import KV, or a draft
        model mirrors the target's KV (its KV would be missing for imported positions)."""
        if not self.runner.capabilities.kv_transfer:
            raise ValueError("this backend cannot import KV from a prefill peer")
        if getattr(self.speculator, "draft", None) is not None:
            raise ValueError("a prefill peer cannot be combined with a draft model")
        self.scheduler.remote = remote

    def import_remote_kv(self, request_id: str, start: int, kv: list[LayerKV]) -> bool:
        """Write one verified chunk of a remote prefill: per layer (K, V) `[n, kv_heads,
        head_dim]` float16 (or q8_0 blocks `[n, blocks]`, `backends.base.LayerKV`) for
        positions `start .. start+n-1`. Returns False (and ends the
        transfer, keeping what was imported) if the request is no longer waiting for it, the
        chunk does not continue its KV, or the runner refuses it."""
        r = self.requests.get(request_id)
        if r is None or r.status is not RequestStatus.REMOTE_PREFILL:
            return False
        n = int(kv[0][0].shape[0]) if kv else 0
        if start != r.num_computed_tokens or n < 1 or start + n > r.num_prompt_tokens - 1:
            self._remote_failed(r, "out_of_order")
            return False
        t0 = time.perf_counter()
        try:
            self.runner.import_kv(r.slot, r.block_table, start, kv)
        except (ValueError, RuntimeError):
            # a refused load may have cleared the slot: recompute the prompt from scratch
            self.residency.truncate(r.slot, 0)
            r.num_computed_tokens = 0
            self._remote_failed(r, "import")
            return False
        r.num_computed_tokens = start + n
        self.block_manager.cache_full_blocks(r, r.num_computed_tokens)
        dt = time.perf_counter() - t0
        info = r.metrics.remote_prefill
        info["imported_tokens"] = info.get("imported_tokens", 0) + n
        info["import_s"] = info.get("import_s", 0.0) + dt
        self.scheduler.remote.observe_import(n, dt)
        return True

    def end_remote_prefill(self, request_id: str, outcome: RemoteOutcome) -> None:
        """A remote prefill ended (all chunks imported, or failed): the request computes the
        rest of its prompt here from the next step on. Ignored if it already ended."""
        r = self.requests.get(request_id)
        if r is None or r.status is not RequestStatus.REMOTE_PREFILL:
            return
        complete = outcome.ok and r.num_computed_tokens == r.num_prompt_tokens - 1
        info = r.metrics.remote_prefill
        info.update(outcome.stats)
        info["ok"] = complete
        if not complete:
            info["failure"] = outcome.reason if not outcome.ok else "incomplete"
        self.scheduler.resume(r)

    def _remote_failed(self, r: Request, reason: str) -> None:
        self.scheduler.remote.cancel(r.request_id)
        r.metrics.remote_prefill.update(ok=False, failure=reason)
        self.scheduler.resume(r)

    # -- the step --------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the outputs it produced (one per request that got
        tokens). See `execute_step` for the computed ranges too."""
        return self.execute_step().outputs

    def execute_step(self) -> StepResult:
        """plan -> build batch -> execute -> sample/verify -> commit. Raises RuntimeError
        from the runner (the step's requests are then in an undefined state)."""
        self.scheduler.release_finished()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.scheduler.waiting,
                                    self.scheduler.config.max_num_batched_tokens)
            self._cut_drafts()
        lone = self._lone_decode()
        if lone is not None:
            return lone
        sched = self.scheduler.schedule()
        if not sched:
            return StepResult()
        if self.speculator is not None:
            self.speculator.fill(sched.num_scheduled_tokens)
        plan = self._build_batch(sched)
        masks = self._start_masks(plan)
        try:
            t0 = time.perf_counter()
            logits = self.runner.execute(plan.items)
            if self.speculator is not None and plan.num_rows == sched.total_tokens:
                # a step whose every token has logits: a point of the step-time curve
                self.speculator.observe_step(plan.num_rows, len(plan.items),
                                             time.perf_counter() - t0)
        finally:
            if masks is not None:  # the worker must be done with the matchers either way
                masks.result()
        if masks is not None:
            logits = self._constrain(plan, logits, masks)
        sampled = self._sample(plan, logits)
        self._verify_sampled_drafts(plan, logits, sampled)
        return self._commit(plan, sampled)

    def _lone_decode(self) -> StepResult | None:
        """The steady decode of a lone plain-greedy request, without the plan: exactly what
        `schedule`, `_build_batch`, `_sample` and `_commit` do for it (a block for the next
        position, its last token computed there, one argmax, the same commit) without the
        scheduler's pass and the plan's objects: at one user, that Python is what a token
        costs beside the decode (README, Benchmarks).

        Returns None, changing nothing, for any other step: more requests running or
        waiting, a prefill, drafts proposed, a request that samples, or no free block for
        the token (the scheduler preempts then)."""
        sched = self.scheduler
        if len(sched.running) != 1 or sched.waiting:
            return None
        r = sched.running[0]
        start = r.num_computed_tokens
        if (r.num_tokens - start != 1 or r.spec_token_ids or not r.plain_greedy
                or not self.block_manager.allocate(r, start + 1)):
            return None
        t0 = time.perf_counter()
        logits = self.runner.execute([BatchItem(r.slot, r.token_ids[start:], start,
                                                r.block_table, [0])])
        if self.speculator is not None:
            self.speculator.observe_step(1, 1, time.perf_counter() - t0)
        token = int(logits[0].argmax())  # the lowest id on a tie, as `_sample`
        now = time.perf_counter()
        r.num_computed_tokens = start + 1
        text, reason = self._append_token(r, token, now)
        self._cache_verified(r, start + 1)
        if reason is not None:
            text += self._end(r, reason, now)
        return StepResult([self._output(r, text, [token], None)],
                          {r.request_id: range(start, start + 1)})

    def _cut_drafts(self) -> None:
        """Cut each constrained request's drafts at the first token its grammar forbids:
        the target could never sample it, so verifying it and what follows is wasted.
        (A draft model's drafts, computed after scheduling, are left whole: the mask
        rejects them in verification.)"""
        for r in self.scheduler.running:
            drafts = r.spec_token_ids
            if r.matcher is not None and drafts and drafts[0] != PENDING:
                del drafts[r.matcher.valid_prefix(drafts):]
                if not drafts:
                    self.speculator.no_draft(r, "grammar")

    def _start_masks(self, plan: StepPlan) -> PendingMasks | None:
        """Start filling the masks of the step's constrained rows (row j of a request: its
        grammar after its drafts `[:j]`, `constrain.mask`); None when no scheduled row is
        constrained."""
        masks: list[MaskRequest] = []
        rows: list[int] = []
        for s in plan.scheduled:
            matcher = s.request.matcher
            if matcher is None or not s.num_rows:
                continue
            masks.append(MaskRequest(matcher, s.first_row,
                                     s.request.spec_token_ids[:s.num_rows - 1]))
            rows.extend(range(s.first_row, s.first_row + s.num_rows))
        if not masks:
            return None
        return self.masks.start(masks, rows, plan.num_rows, self.runner.info.n_vocab)

    def _constrain(self, plan: StepPlan, logits: np.ndarray,
                   masks: PendingMasks) -> np.ndarray:
        """The step's first `plan.num_rows` logits rows with every constrained row masked
        to what its grammar allows, in place (only a read-only array is copied)."""
        bitmask = masks.result()
        t0 = time.perf_counter()
        out = apply_masks(logits[:plan.num_rows], bitmask, masks.rows, sorted(self.eos_ids))
        self.mask_stats.observe(len(masks.requests), masks.fill_s,
                                time.perf_counter() - t0, masks.wait_s)
        return out

    def _build_batch(self, sched: SchedulerOutput) -> StepPlan:
        plan = StepPlan()
        now = time.perf_counter()
        for request, num_new in sched.num_scheduled_tokens.items():
            start = request.num_computed_tokens
            end = start + num_new
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
            num_real = request.num_tokens
            num_drafts = max(0, end - num_real)
            if num_drafts < len(request.spec_token_ids):
                del request.spec_token_ids[num_drafts:]  # the budget cut them
            tokens = request.token_ids[start:min(end, num_real)] + request.spec_token_ids
            # logits from the last real token on: its next token, then one per draft
            num_rows = num_drafts + 1 if end >= num_real else 0
            first_index = num_new - num_rows
            plan.items.append(BatchItem(
                slot=request.slot,
                tokens=tokens,
                start_pos=start,
                block_table=request.block_table,
                logits_indices=list(range(first_index, num_new)),
            ))
            plan.scheduled.append(ScheduledRequest(request, start, num_new, num_drafts,
                                                   plan.num_rows, num_rows))
            plan.num_rows += num_rows
        return plan

    def _sample(self, plan: StepPlan, logits: np.ndarray) -> dict[Request, list[Sampled]]:
        """The target's token at every logits row, from the request's full sampler.

        Row j of a request samples its output position `num_output + j`, with penalties over
        the history that includes the drafts before it: exactly what plain decoding would do
        had those drafts been generated (which is the only case in which row j is used).
        One `sample` call covers the whole batch. A batch of one plain-greedy row per
        request (`Request.plain_greedy`, no drafts: the steady decode of greedy requests)
        is one argmax instead, with the sampler's tie rule (lowest id).
        """
        if plan.num_rows == len(plan.scheduled) and all(
                s.num_rows == 1 and s.request.plain_greedy for s in plan.scheduled):
            # the decode hot path: one greedy row per request, nothing else to compute
            tokens = logits[:plan.num_rows].argmax(axis=1).tolist()
            return {s.request: [(t, None)] for s, t in zip(plan.scheduled, tokens, strict=True)}
        rows_params, rows_prompt, rows_output, rows_rng = [], [], [], []
        owners: list[tuple[Request, int]] = []
        for s in plan.scheduled:
            if not s.num_rows:
                continue
            r = s.request
            greedy = r.params.greedy  # a greedy row never draws
            output = r.output_ids
            for j in range(s.num_rows):
                rows_params.append(r.params)
                rows_prompt.append(r.prompt_ids)
                rows_output.append(output + r.spec_token_ids[:j] if j else output)
                rows_rng.append(None if greedy
                                else position_rng(r.seed_key, len(output) + j))
                owners.append((r, j))
        if not owners:
            return {}
        result = sample(logits[:plan.num_rows], rows_params, rows_prompt, rows_output, rows_rng)
        sampled: dict[Request, list[Sampled]] = {}
        for row, (r, _) in enumerate(owners):
            lp = result.logprobs[row] if result.logprobs else None
            sampled.setdefault(r, []).append((int(result.token_ids[row]), lp))
        return sampled

    def _verify_sampled_drafts(self, plan: StepPlan, logits: np.ndarray,
                               sampled: dict[Request, list[Sampled]]) -> None:
        """Rejection sampling for drafts a draft model sampled (with their distributions q
        in `spec_state["q"]`): position j's target token becomes the draft if accepted
        (probability min(1, p/q)), else a draw from norm(max(0, p - q)), and the positions
        after a rejection are dropped; the token after a fully accepted draft stays the
        target's own sample. Draws are keyed by (seed, position), streams 1 and 2."""
        for s in plan.scheduled:
            r = s.request
            qs = r.spec_state.pop("q", None)
            if not qs or not s.num_drafts:
                continue
            targets = sampled[r]
            output = r.output_ids
            for j, draft in enumerate(r.spec_token_ids):
                p = distribution(logits[s.first_row + j], r.params, r.prompt_ids,
                                 output + r.spec_token_ids[:j])
                rng = position_rng(r.seed_key, len(output) + j, stream=1)
                token, ok = rejection_sample(p, qs[j], draft, rng.random(), rng.random())
                targets[j] = (token, None)
                if not ok:
                    del targets[j + 1:]
                    break

    def _commit(self, plan: StepPlan, sampled: dict[Request, list[Sampled]]) -> StepResult:
        result = StepResult()
        now = time.perf_counter()
        for s in plan.scheduled:
            r = s.request
            r.num_computed_tokens = s.start + s.num_tokens
            if not s.num_rows:  # a prefill chunk: all computed, nothing to sample
                self.block_manager.cache_full_blocks(r, r.num_computed_tokens)
                result.computed[r.request_id] = range(s.start, r.num_computed_tokens)
                continue
            targets = sampled[r]
            drafts = r.spec_token_ids
            r.spec_token_ids = []
            # verify: accept drafts while the target's token equals the draft (for sampled
            # drafts, `_verify_sampled_drafts` already made the targets so)
            num_accepted = 0
            while num_accepted < len(drafts) and targets[num_accepted][0] == drafts[num_accepted]:
                num_accepted += 1
            accepted = targets[:num_accepted + 1]
            metrics = r.metrics
            if drafts:
                metrics.num_drafts += 1
                metrics.num_draft_tokens += len(drafts)
                metrics.num_accepted_tokens += num_accepted
                if self.speculator is not None:
                    self.speculator.observe(r, len(drafts), num_accepted)
            # KV is valid for every real token and the accepted drafts
            valid = s.start + s.num_tokens - (len(drafts) - num_accepted)
            text, token_ids, logprobs, reason = "", [], [], None
            for token, lp in accepted:
                piece, reason = self._append_token(r, token, now)
                if reason is None and r.matcher is not None:
                    reason = self._advance_grammar(r, token)
                text += piece
                token_ids.append(token)
                if lp is not None:
                    logprobs.append(self._token_logprob(token, lp))
                if reason is not None:
                    break
            verified = min(valid, r.num_tokens)
            r.num_computed_tokens = verified
            self._cache_verified(r, verified)
            result.computed[r.request_id] = range(s.start, verified)
            if reason is not None:
                text += self._end(r, reason, now)
            elif valid < s.start + s.num_tokens:
                # roll back the rejected drafts' KV and the blocks only they used
                self.residency.truncate(r.slot, verified)
                self.block_manager.shrink(r, r.num_tokens)
            result.outputs.append(self._output(r, text, token_ids, logprobs or None))
        return result

    def _cache_verified(self, r: Request, verified: int) -> None:
        """Register `r`'s blocks full of its first `verified` tokens in the prefix cache: a
        prompt's at once, decoded ones `DECODE_HASH_BATCH_TOKENS` at a time."""
        bs = self.block_manager.block_size
        if (r.num_hashed_blocks < r.num_prompt_tokens // bs
                or verified - r.num_hashed_blocks * bs >= DECODE_HASH_BATCH_TOKENS):
            self.block_manager.cache_full_blocks(r, verified)

    def _end(self, r: Request, reason: str, now: float) -> str:
        """Finish `r` after its last token; returns the text its detokenizer still held."""
        text = "" if r.detokenizer.stopped else r.detokenizer.flush()
        r.metrics.finish_time = now
        self._finish(r, reason)
        return text

    def _append_token(self, request: Request, token: int, now: float) -> tuple[str, str | None]:
        """Append one accepted token; returns (its new text, finish reason or None)."""
        params = request.params
        request.token_ids.append(token)
        self.generation_tokens_total += 1
        metrics = request.metrics
        metrics.completion_tokens += 1
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            self.prompt_tokens_total += request.num_prompt_tokens
            route = metrics.remote_prefill
            if route is not None and not route["remote"] and self.scheduler.remote is not None:
                self.scheduler.remote.observe_local(
                    request.num_prompt_tokens - metrics.cached_tokens,
                    now - metrics.first_scheduled_time)
        is_eos = (token in self.eos_ids and not params.ignore_eos) or token in params.stop_token_ids
        text = "" if is_eos else request.detokenizer.push(token)
        if is_eos or request.detokenizer.stopped:
            return text, "stop"
        if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
            return text, "length"
        if request.num_tokens >= self.context_length:
            return text, "length"
        return text, None

    @staticmethod
    def _advance_grammar(r: Request, token: int) -> str | None:
        """Feed an accepted token to `r`'s matcher; "stop" once the grammar is complete
        (it allows nothing but end of sequence), else None. A token the grammar refuses
        cannot be sampled under its mask; should it happen, the request stops there."""
        matcher = r.matcher
        if not matcher.consume(token) or matcher.stopped:
            return "stop"
        return None

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
        if self.speculator is not None:
            self.speculator.finished(request)
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
            stop_sequence=(request.detokenizer.stop_matched
                           if finished and request.detokenizer is not None else None),
        )

    def close(self) -> None:
        """Close the prefill peer's client, the runner, and the draft model's if any."""
        if self.scheduler.remote is not None:
            self.scheduler.remote.close()
        self.masks.close()
        self.runner.close()
        draft = getattr(self.speculator, "draft", None)
        if draft is not None:
            draft.runner.close()

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            remote_prefilling=len(self.scheduler.remote_prefilling),
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used_blocks,
            prefix_cache_hit_tokens=bm.hit_tokens_total,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            requests_finished=self.requests_finished,
            slots_total=self.runner.max_seqs,
            slots_used=self.runner.max_seqs - self.slots.num_available,
            kv_saved_bytes=getattr(self.runner, "saved_bytes", 0),
        )
