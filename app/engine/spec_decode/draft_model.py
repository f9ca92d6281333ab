"""A draft model as proposer: a smaller model with the target's vocabulary drafts greedily
for every drafting sequence in one batched call per draft position.

Its KV lives in its own runner, in the same slots and block ids as the target's, mirrored by
`app.engine.residency.MirroredResidency`. It computes only what it lacks: the tokens the
target accepted since it last drafted (all of the prompt the first time), then one token per
draft position.

Greedy and seeded requests (and those asking for logprobs) get greedy drafts: they are
deterministic, so verification is exact by equality and a seeded request gives the same
text as without speculation. Other sampled requests get drafts sampled from the draft's own
distribution q under the request's sampler, recorded for rejection sampling
(`app.engine.spec_decode.verify`), which accepts more of them and is exact in distribution.
"""

from __future__ import annotations

import numpy as np

from app.engine.request import Request
from app.engine.residency import MirroredResidency
from app.engine.sampler import GREEDY_TEMPERATURE, distribution, draw
from backends.base import BatchItem, Runner

# placeholder for a draft token the draft model fills in after scheduling
PENDING = -1


def check_same_vocabulary(target: Runner, draft: Runner) -> None:
    """Raises ValueError naming the first difference between the two runners' vocabularies
    (size, BOS, EOS/EOT ids, then each token's bytes)."""
    t, d = target.tokenizer, draft.tokenizer
    if target.info.n_vocab != draft.info.n_vocab:
        raise ValueError(f"vocabulary size {draft.info.n_vocab} != target's {target.info.n_vocab}")
    if t.bos_id != d.bos_id:
        raise ValueError(f"BOS id {d.bos_id} != target's {t.bos_id}")
    if set(t.eos_ids) != set(d.eos_ids):
        raise ValueError(f"EOS/EOT ids {sorted(d.eos_ids)} != target's {sorted(t.eos_ids)}")
    for i in range(target.info.n_vocab):
        if t.token_text(i) != d.token_text(i):
            raise ValueError(f"token {i} is {d.token_text(i)!r}, the target's {t.token_text(i)!r}")


class DraftModelProposer:
    """Args:
    runner: the draft model's runner (same `block_size`, `max_seqs` and `num_blocks` as the
        target's, so slots and block ids mean the same).
    residency: the engine's mirrored residency (tracks what the draft holds per slot).
    Raises ValueError if the runner's shape does not mirror the target's (see `check`).
    """

    name = "draft"

    def __init__(self, runner: Runner, residency: MirroredResidency):
        self.runner = runner
        self.residency = residency
        self.max_batch_tokens = getattr(runner, "max_batch_tokens", 512)
        self._rng = np.random.default_rng()  # draft samples need no reproducibility

    def kind(self, request: Request) -> str:
        return "draft"

    def fill(self, requests: list[Request]) -> None:
        """Replace each request's `PENDING` drafts with the draft model's tokens (greedy, or
        sampled with their q recorded in `spec_state["q"]`).

        The requests are scheduled: their block tables cover every drafted position."""
        todo = [r for r in requests if r.spec_token_ids and r.spec_token_ids[0] == PENDING]
        if not todo:
            return
        for r in todo:
            r.spec_state.pop("q", None)
        held = self.residency.draft_tokens
        self._catch_up(todo)
        # draft position 0: the last real token, whose logits give the first draft
        want = {id(r): len(r.spec_token_ids) for r in todo}
        out: dict[int, list[int]] = {id(r): [] for r in todo}
        live = list(todo)
        inputs = {id(r): r.token_ids[-1] for r in todo}
        while live:
            items = []
            for r in live:
                pos = r.num_tokens - 1 + len(out[id(r)])
                items.append(BatchItem(r.slot, [inputs[id(r)]], pos, r.block_table, [0]))
            logits = self.runner.execute(items)
            tokens = np.argmax(logits, axis=1)
            still = []
            for row, r in enumerate(live):
                tok = int(tokens[row])
                if _samples(r):
                    q = distribution(logits[row], r.params, r.prompt_ids,
                                     r.output_ids + out[id(r)])
                    tok = draw(q, self._rng.random())
                    r.spec_state.setdefault("q", []).append(q)
                held[r.slot] = r.num_tokens + len(out[id(r)])
                out[id(r)].append(int(tok))
                inputs[id(r)] = int(tok)
                if len(out[id(r)]) < want[id(r)]:
                    still.append(r)
            live = still
        for r in todo:
            r.spec_token_ids = out[id(r)]


    def _catch_up(self, requests: list[Request]) -> None:
        """Compute, in chunks of at most `max_batch_tokens`, the tokens each request's draft
        KV lacks, up to (not including) its last real token."""
        held = self.residency.draft_tokens
        while True:
            items, budget = [], self.max_batch_tokens
            for r in requests:
                have = held.get(r.slot, 0)
                n = min(r.num_tokens - 1 - have, budget)
                if n > 0:
                    items.append(BatchItem(r.slot, r.token_ids[have:have + n], have,
                                           r.block_table, []))
                    held[r.slot] = have + n
                    budget -= n
            if not items:
                return
            self.runner.execute(items)


def _samples(r: Request) -> bool:
    """Whether `r` gets sampled drafts (see the module docstring)."""
    p = r.params
    return p.temperature >= GREEDY_TEMPERATURE and p.seed is None and p.logprobs is None
