"""Speculative-decoding benchmark: tokens/s per mode, workload and concurrency, with ratios
against speculation off measured in the same run (`tandem bench --spec ...`).

Workloads:
- code-edit: "rename this variable in the code below" (copy-heavy: n-gram drafts);
- prediction: the same requests with the original code as OpenAI `prediction`;
- file-edit: Predicted Outputs on a 200-line file, one rename per request, the whole file
  as the prediction (`app.bench.file_edit`);
- free: free writing (few useful drafts);
- agent-loop: a coding agent's tool loop, 10 turns per conversation, each turn's prompt the
  conversation so far (`app.bench.agent_loop`); one conversation per user, turns in order,
  with prefix caching as a server has it;
- chat: a multi-turn chat, 6 turns, each asking to change the function the previous reply
  wrote (`app.bench.agent_loop.CHAT`), run like agent-loop.
Each (workload, concurrency) cell runs every mode back to back on one runner through the
synchronous engine, greedy, in the split KV layout. Mode `oracle` (bench only) is `auto`
with each request's `prediction` the tokens `off` gave it: what drafting reaches on this
machine's step-time curve when every draft is right, the ceiling any proposer has on the
workload. `prefill_step_s` is the part of a cell's wall time spent in steps that prefilled
a prompt chunk (a conversation's later turns; at concurrency > 1 also other users' first
prompts), which no draft shortens. `same_tokens` says whether a mode gave off's tokens: by
default a verify step's logits can differ from one-token steps' (README, "Grouping
invariance"), so a near tie may flip; with `--exact` every mode must agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from app.bench import file_edit
from app.bench.agent_loop import SCRIPTS, Conversations
from app.bench.charts import ChartContext, bar_panel, figure, save, suptitle
from app.bench.stats import ratio
from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.engine import LLMEngine
from app.engine.residency import MirroredResidency
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.draft_model import DraftModelProposer
from app.engine.spec_decode.speculator import Speculator
from app.engine.spec_decode.step_times import OnlineStepTimes
from app.engine.types import SamplingParams
from app.prompts import chat_prompt_ids
from backends.base import Runner

CODE = [
    '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    discount = 0
    if subtotal > 100:
        discount = subtotal * 0.05
    tax = (subtotal - discount) * tax_rate
    return subtotal - discount + tax
''',
    '''class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, step=1):
        self.count += step
        return self.count

    def reset(self):
        self.count = 0
        return self.count
''',
]
RENAMES = [("subtotal", "net"), ("count", "value")]
TOPICS = ["a lighthouse keeper", "a robot learning to paint", "a city under the sea",
          "the last day of summer", "a dragon who collects clocks", "a train that never stops"]
WORKLOADS = ("code-edit", "prediction", "file-edit", "free", "agent-loop", "chat")
ORACLE = "oracle"
FollowUp = Callable[[int, list[list[int]]], "tuple[list[int], SamplingParams] | None"]


def requests_for(workload: str, runner: Runner, n: int, max_tokens: int
                 ) -> list[tuple[list[int], SamplingParams]]:
    """`n` (prompt ids, params) of `workload`; greedy. For agent-loop and chat, each
    conversation's first turn (`Conversations.follow` gives the next ones)."""
    if workload in SCRIPTS:
        talk = Conversations(runner.tokenizer, max_tokens, SCRIPTS[workload])
        return [talk.first(i) for i in range(n)]
    out = []
    for i in range(n):
        if workload == "free":
            text = f"Write a short story about {TOPICS[i % len(TOPICS)]}."
            prediction = None
        elif workload == "file-edit":
            text, block = file_edit.prompt_text(i)
            prediction = runner.tokenizer.encode(block)
        else:
            code = CODE[i % len(CODE)]
            old, new = RENAMES[i % len(RENAMES)]
            text = f"Rename the variable {old} to {new} in the code below.\n\n```python\n{code}```"
            prediction = (runner.tokenizer.encode(f"```python\n{code}```")
                          if workload == "prediction" else None)
        prompt = chat_prompt_ids(runner.tokenizer, [{"role": "user", "content": text}])
        out.append((prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                           prediction=prediction)))
    return out


def run_cell(runner: Runner, requests, mode: str, curve: StepTimeCurve, context: int,
             num_draft_tokens: int = 8,
             draft: tuple[Runner, StepTimeCurve] | None = None,
             follow: FollowUp | None = None, suffix_tokens: int = 1 << 15,
             oracle: dict[str, list[int]] | None = None,
             online: OnlineStepTimes | None = None) -> dict:
    """Serve `requests` together under `mode`; tokens/s, acceptance, chosen k and `tokens`
    (request id "i:turn" -> output token ids). `draft` (a draft model's runner and step-time
    curve) joins every mode but off. `follow(i, replies)`: request i's next turn once its
    replies so far (token ids) are done, or None (then prefix caching is on, as a server has
    it for a conversation). `suffix_tokens`: the suffix index's cap (0: none). `oracle`
    (mode `oracle`): each request id's `prediction`, the output `off` gave it. `online`:
    the curve refined from the cell's steps per batch size, as `tandem serve` has it (None:
    `curve` for every step)."""
    if mode == ORACLE and oracle is None:
        raise ValueError("mode oracle needs the off cell's tokens")
    blocks = list(range(runner.num_blocks))
    runner.evict(blocks)  # nothing cached from an earlier cell
    config = EngineConfig(context_length=context, enable_prefix_caching=follow is not None,
                          scheduler=SchedulerConfig(max_num_seqs=runner.max_seqs,
                                                    max_num_batched_tokens=512))
    speculator = residency = None
    if mode != "off":
        proposer = draft_curve = None
        if draft is not None:
            draft[0].evict(blocks)
            residency = MirroredResidency(runner, draft[0], runner.block_size)
            proposer, draft_curve = DraftModelProposer(draft[0], residency), draft[1]
        speculator = Speculator(SpecConfig(mode="auto" if mode == ORACLE else mode,
                                           num_draft_tokens=num_draft_tokens,
                                           suffix_tokens=suffix_tokens),
                                curve, context, runner.capabilities.equal_split,
                                proposer, draft_curve, online)
    engine = LLMEngine(runner, config, residency=residency, speculator=speculator)

    def add(request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if mode == ORACLE:
            params = replace(params, prediction=oracle.get(request_id))
        engine.add_request(request_id, prompt, params)

    for i, (prompt, params) in enumerate(requests):
        add(f"{i}:0", prompt, params)
    tokens: dict[str, list[int]] = {}
    replies: dict[int, list[list[int]]] = {i: [] for i in range(len(requests))}
    steps = 0
    prefill_step_s = 0.0
    t0 = time.perf_counter()
    first = None
    sched = engine.scheduler
    while engine.has_work():
        # requests with a prompt still to compute, and how far they were: a step that
        # advanced one of them prefilled (the first step is before the wall starts)
        prefilling = {r: r.num_computed_tokens for r in (*sched.running, *sched.waiting)
                      if r.num_tokens - r.num_computed_tokens > 1} if first is not None else {}
        t_step = time.perf_counter()
        outs = engine.step()
        if any(r.num_computed_tokens > n for r, n in prefilling.items()):
            prefill_step_s += time.perf_counter() - t_step
        for out in outs:
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if first is None:
                first = time.perf_counter()
            if out.finished and follow is not None:
                i = int(out.request_id.split(":")[0])
                replies[i].append(tokens[out.request_id])
                turn = follow(i, replies[i])
                if turn is not None:
                    add(f"{i}:{len(replies[i])}", *turn)
        steps += 1
    wall = time.perf_counter() - (first or t0)
    n_tokens = sum(len(t) for t in tokens.values()) - len(tokens)  # decode tokens
    stats = speculator.stats.snapshot() if speculator else {}
    drafted = stats.get("draft_tokens", 0)
    return {
        "mode": mode,
        "decode_tok_s": round(n_tokens / wall, 2) if wall > 0 else None,
        "per_user_tok_s": round(n_tokens / wall / len(requests), 2) if wall > 0 else None,
        "steps": steps,
        "prefill_step_s": round(prefill_step_s, 2),
        "draft_tokens": drafted,
        "acceptance": round(stats["accepted_tokens"] / drafted, 3) if drafted else None,
        "chosen_k": stats.get("chosen_k", {}),
        "suffix_tokens": stats.get("suffix_tokens"),
        "tokens": tokens,
    }


def run_spec_bench(runner: Runner, curve: StepTimeCurve, workloads, levels, modes,
                   max_tokens: int, emit: Callable[[dict], None],
                   draft: tuple[Runner, StepTimeCurve] | None = None,
                   suffix_tokens: int = 1 << 15, num_draft_tokens: int = 8,
                   online: Callable[[], OnlineStepTimes] | None = None) -> list[dict]:
    """Every (workload, concurrency) cell: each mode, ratio against off, and whether every
    mode gave off's tokens (`same_tokens`). Each cell's context: the longest prompt plus
    `max_tokens`, at least 2048, at most the runner's slot. `online()`: a fresh refining
    curve for each cell (`run_cell`), so every mode starts from the same estimates."""
    results = []
    for workload in workloads:
        for c in levels:
            reqs = requests_for(workload, runner, c, max_tokens)
            longest = max(len(prompt) for prompt, _ in reqs)
            context = min(runner.max_seq_tokens, max(2048, longest + max_tokens))
            follow = (Conversations(runner.tokenizer, max_tokens, SCRIPTS[workload]).follow
                      if workload in SCRIPTS else None)
            cells: dict[str, dict] = {}
            for m in ("off", *modes):
                cells[m] = run_cell(runner, reqs, m, curve, context, num_draft_tokens,
                                    draft=draft, follow=follow, suffix_tokens=suffix_tokens,
                                    oracle=cells["off"]["tokens"] if m == ORACLE else None,
                                    online=online() if online is not None else None)
            base = cells["off"]
            for cell in cells.values():
                row = {"workload": workload, "concurrency": c, **cell,
                       "ratio_vs_off": ratio(cell["decode_tok_s"], base["decode_tok_s"]),
                       "same_tokens": cell["tokens"] == base["tokens"]}
                del row["tokens"]
                emit(row)
                results.append(row)
    return results


def plot_frontier(results: list[dict], path: str | Path, context: ChartContext):
    """One panel per workload, in the order run (the command line's): decode tok/s of all
    users per concurrency level (categories), one bar per mode, labelled with its value and
    its ratio to off; every panel on the same y scale, from 0. Written to `path` as PNG.
    Returns the Figure."""
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    modes = list(dict.fromkeys(r["mode"] for r in results))
    top = max((r["decode_tok_s"] or 0 for r in results), default=0)
    fig, axes = figure(len(workloads))
    suptitle(fig, context, "Speculative decoding: decode speed per mode")
    for ax, workload in zip(axes, workloads, strict=True):
        rows = [r for r in results if r["workload"] == workload]
        levels = list(dict.fromkeys(r["concurrency"] for r in rows))
        cell = {(r["mode"], r["concurrency"]): r for r in rows}
        series = {m: [cell.get((m, c), {}).get("decode_tok_s") for c in levels] for m in modes}
        labels = {m: [_bar_label(cell.get((m, c))) for c in levels] for m in modes}
        bar_panel(ax, [str(c) for c in levels], series, labels=labels, ymax=top,
                  title=f"workload: {workload}", ylabel="decode tok/s, all users",
                  better="higher", legend=False)
    if len(modes) > 1:  # one legend for every panel, beside them
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center",
                   title="mode\n(bars: tok/s,\n× = ratio to off)", fontsize=8, title_fontsize=8)
    save(fig, path)
    return fig


def _bar_label(row: dict | None) -> str:
    """`112` for off, `112\n×0.97` (ratio to off) for the other modes; `n/a` if not run."""
    if row is None or row["decode_tok_s"] is None:
        return "n/a"
    value = f"{row['decode_tok_s']:.0f}"
    if row["mode"] == "off" or row["ratio_vs_off"] is None:
        return value
    return f"{value}\n×{row['ratio_vs_off']:.2f}"
