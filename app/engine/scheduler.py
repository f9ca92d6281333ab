"""Iteration-level (continuous) batching with a per-step token budget.

Every step each request is given a number of tokens to compute so that
`num_computed_tokens` catches up with `num_tokens` plus its drafts (vLLM v1): a decode is 1 token
plus its drafts, a prompt is computed in chunks of at most the remaining budget, so long
prompts never stall decodes. Drafts get only what budget the real tokens (decodes, prefill
chunks, admissions) leave, so prefill chunk boundaries are the same with speculation on or
off: on llama.cpp's CPU kernels a chunk boundary can move logits, and speculation must not
change the output.
Running requests are served first (oldest first); waiting requests are admitted while budget,
slots and KV blocks last. When blocks run out the newest running request is preempted: its
blocks are freed (their cached prefix usually survives) and it is recomputed later.
With a prefill peer (`remote`, the two-box mode) an admitted prompt the peer's policy wants
is parked in `remote_prefilling` with its slot and blocks until its KV has been imported
(`app/engine/remote_prefill.py`); it takes no step budget meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from app.engine.block_manager import BlockManager
from app.engine.config import SchedulerConfig
from app.engine.remote_prefill import RemoteJob, RemotePrefill
from app.engine.request import Request, RequestStatus
from app.engine.slots import SlotPool
from backends.base import KVResidency

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerOutput"]

# A waiting prompt holds back for a step, to hit a running prefill's blocks in the cache, only
# when it shares at least this many tokens with that prompt (8: one block of the 8-token
# blocks the rule was first measured with; see `_next_blocks_inflight`).
MIN_SHARED_INFLIGHT_TOKENS = 8


@dataclass(slots=True)
class SchedulerOutput:
    """One step: {request: tokens to compute}, in batch order, plus requests preempted.

    A running request's tokens may end in drafts (`Request.spec_token_ids`); a budget that
    cuts into them computes only the leading ones.
    """

    num_scheduled_tokens: dict[Request, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    def __bool__(self) -> bool:
        return bool(self.num_scheduled_tokens)


class Scheduler:
    """Args:
    config: limits.
    block_manager: KV accounting.
    slots: the runner's sequence slots.
    residency: the runner's (or runners') KV residency: `share_blocks` at admission of a
        prefix hit (it may serve fewer blocks; the rest are recomputed), `release` when a
        request's slot is freed (its first `num_hashed_blocks` blocks stay restorable).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        slots: SlotPool,
        residency: KVResidency,
    ):
        self.config = config
        self.block_manager = block_manager
        self.slots = slots
        self.residency = residency
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.remote: RemotePrefill | None = None
        self.remote_prefilling: list[Request] = []
        # True: a finished request's slot is released by `release_finished`, not by `finish`
        self.defer_releases = False
        self._finished_slots: list[tuple[int, int]] = []  # (slot, blocks to keep)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        # 1. running requests, oldest first; preempt from the newest end when blocks run out
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            target = request.num_computed_tokens + num_new
            while not self.block_manager.allocate(request, target):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.num_scheduled_tokens[request] = num_new
                budget -= num_new
                i += 1
                continue
            break  # the request preempted itself: nothing more fits

        # 2. admit waiting requests (not while preempting: memory is short)
        inflight = self._inflight_prompt_blocks()
        while (
            self.waiting
            and budget > 0
            and not out.preempted
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting[0]
            cached = self.block_manager.find_cached_prefix(
                request.token_ids,
                self._prompt_hashes(request) if self.block_manager.enable_prefix_caching
                else ())
            if self._next_blocks_inflight(request, len(cached), inflight):
                # a running prefill is computing this prompt's next blocks right now: wait a
                # step and hit them in the cache instead of computing them twice (16 users
                # sharing a system prompt would otherwise all prefill its tail)
                break
            slot = self.slots.acquire()
            if slot is None:
                break
            num_cached = len(cached) * self.block_manager.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not self.block_manager.allocate(request, num_cached + num_new, cached):
                self.slots.release(slot)
                break
            self.waiting.popleft()
            request.slot = slot
            if cached:
                n_shared = self.residency.share_blocks(slot, cached)
                if n_shared < len(cached):
                    # recompute the rest into the same (already allocated) blocks
                    self.block_manager.note_partial_hit(len(cached), n_shared)
                    num_cached = n_shared * self.block_manager.block_size
                    num_new = min(request.num_tokens - num_cached, budget)
            request.num_computed_tokens = num_cached
            if request.num_preemptions == 0:
                request.metrics.cached_tokens = num_cached
            if self._start_remote(request, num_cached):
                continue
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.num_scheduled_tokens[request] = num_new
            budget -= num_new
            if self.block_manager.enable_prefix_caching:
                # its prompt blocks are in flight from now on, for the next in the queue too
                inflight.update(self._prompt_hashes(request)[request.num_hashed_blocks:])

        # 3. drafts of decoding requests, from what budget is left; never preempting for them
        for request, num_new in out.num_scheduled_tokens.items():
            if not request.spec_token_ids:
                continue
            end = request.num_computed_tokens + num_new
            extra = 0
            if not out.preempted and end == request.num_tokens:
                extra = min(len(request.spec_token_ids), budget)
                if extra and not self.block_manager.allocate(request, end + extra):
                    extra = 0
            del request.spec_token_ids[extra:]
            out.num_scheduled_tokens[request] = num_new + extra
            budget -= extra
        return out

    def _start_remote(self, request: Request, num_cached: int) -> bool:
        """Hand a just-admitted prompt to the prefill peer if its policy wants it and the
        blocks for the whole prompt can be allocated now (imports write into them)."""
        if self.remote is None or request.num_preemptions:
            return False
        n = request.num_prompt_tokens - 1  # the last prompt token is always computed here
        if n <= num_cached:
            return False
        go, reason, *numbers = self.remote.decide(n, num_cached)
        if go and not self.block_manager.allocate(request, request.num_tokens):
            go, reason = False, "kv_full"
        request.metrics.remote_prefill = {"remote": go, "reason": reason,
                                          **(numbers[0] if numbers else {})}
        if not go:
            return False
        request.status = RequestStatus.REMOTE_PREFILL
        request.metrics.first_scheduled_time = time.perf_counter()  # its prefill starts now
        self.remote_prefilling.append(request)
        self.remote.begin(RemoteJob(request.request_id, request.prompt_ids[:-1], num_cached))
        return True

    def resume(self, request: Request) -> None:
        """A remote prefill ended: the request computes the rest of its prompt here."""
        self.remote_prefilling.remove(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _prompt_hashes(self, request: Request) -> list[bytes]:
        if request.prompt_block_hashes is None:
            n_full = request.num_prompt_tokens // self.block_manager.block_size
            request.prompt_block_hashes = self.block_manager.block_hashes(request.prompt_ids,
                                                                          n_full)
        return request.prompt_block_hashes

    def _inflight_prompt_blocks(self) -> set[bytes]:
        """Hashes of full prompt blocks that running requests have yet to compute."""
        if not self.block_manager.enable_prefix_caching:
            return set()
        inflight: set[bytes] = set()
        for r in self.running:
            if r.num_computed_tokens < r.num_prompt_tokens:
                inflight.update(self._prompt_hashes(r)[r.num_hashed_blocks:])
        return inflight

    def _next_blocks_inflight(self, request: Request, num_hits: int,
                              inflight: set[bytes]) -> bool:
        """Whether the blocks after the prompt's cache hit are in flight, at least one and
        enough for hit and run to share `MIN_SHARED_INFLIGHT_TOKENS` with the running
        prompt: a step's wait pays for a shared system prompt, not for the few tokens two
        prompts happen to start with."""
        if not inflight:
            return False
        hashes = self._prompt_hashes(request)
        bs = self.block_manager.block_size
        need = max(1, -(-(MIN_SHARED_INFLIGHT_TOKENS - num_hits * bs) // bs))
        run = hashes[num_hits:num_hits + need]
        return len(run) == need and all(h in inflight for h in run)

    def _preempt(self, request: Request) -> None:
        """Free a running request and put it at the head of the queue for recompute."""
        self.running.remove(request)
        self._free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def _free(self, request: Request, defer: bool = False) -> None:
        # the commit registers decoded tokens in batches: the rest of them now, so that the
        # whole verified sequence stays restorable
        self.block_manager.cache_full_blocks(request, request.num_computed_tokens)
        n_keep = request.num_hashed_blocks
        self.block_manager.free(request)
        if request.slot is not None:
            if defer:
                self._finished_slots.append((request.slot, n_keep))
            else:
                self._release(request.slot, n_keep)
            request.slot = None

    def _release(self, slot: int, n_keep: int) -> None:
        self.residency.release(slot, n_keep)
        self.slots.release(slot)

    def release_finished(self) -> None:
        """Release the slots of the requests finished since the last call (with
        `defer_releases`): their cached prefix is saved to host memory (llama.cpp: a copy of
        megabytes, milliseconds) and the slot freed for the next admission. Deferred so that
        a finished request's last output can be delivered before that copy; it must run
        before anything else touches the runner's KV, so `LLMEngine.execute_step` calls it
        first. In the order the requests finished."""
        while self._finished_slots:
            self._release(*self._finished_slots.pop(0))

    def finish(self, request: Request, reason: str) -> None:
        """Mark a request finished (`stop`, `length` or `abort`) and return its resources."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self._free(request, self.defer_releases)
        elif request.status is RequestStatus.REMOTE_PREFILL:
            self.remote_prefilling.remove(request)
            self._free(request)
            if self.remote is not None:
                self.remote.cancel(request.request_id)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
