"""Structured-output benchmark: constrained decode tokens/s against unconstrained, with and
without grammar-forced drafts, measured in the same run (`tandem bench --workload
json-schema,free`).

Per concurrency level c, each workload's requests (c at once; at c = 1, `SEQUENTIAL`
one after another) run through the synchronous engine, greedy, with the adaptive
speculator (`--spec`, default auto):
- `json-schema` with forced drafts, then without (`SpecConfig.forced_drafts`): the same
  prompts under their schemas (`SCHEMAS`, one per request in turn);
- `free`, the baseline: the same prompts unconstrained, each request run (ignoring EOS)
  to exactly the length of its constrained output, so both cells decode the same number of
  tokens per request and the batch empties the same way.
Reported per cell: decode tokens/s (tokens after each request's first, over the wall time
from the first first token to the last token) and its ratio to `free`; for constrained
cells, draft and forced-draft counts, the forced share of output tokens, grammar mask time
per sequence (fill, apply; p50/p99 ms), outputs valid against their schema (`jsonschema`),
outputs ended by max_tokens inside whitespace; once per run, grammar compile times.
A workload is a `Workload` in `WORKLOADS`; `tools` joins when tool calling lands.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import jsonschema

from app.bench.stats import percentiles, ratio
from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from app.engine.constrain import GrammarCompiler, ResponseFormat
from app.engine.engine import LLMEngine
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.spec_decode.speculator import Speculator
from app.engine.types import SamplingParams
from app.prompts import chat_prompt_ids
from backends.base import Runner

SEQUENTIAL = 3  # requests at concurrency 1, one after another

_STR = {"type": "string", "maxLength": 24}
SCHEMAS: list[tuple[str, dict]] = [
    ("an order with fields id, customer, items (sku, qty) and status", {
        "type": "object", "additionalProperties": False,
        "required": ["id", "customer", "items", "status"],
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 99999},
            "customer": _STR,
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string", "maxLength": 8},
                               "qty": {"type": "integer", "minimum": 1, "maximum": 9}}}},
            "status": {"enum": ["open", "paid", "shipped", "cancelled"]}}}),
    ("a user profile with fields name, age, email, country, languages and active", {
        "type": "object", "additionalProperties": False,
        "required": ["name", "age", "email", "country", "languages", "active"],
        "properties": {
            "name": _STR, "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "maxLength": 32},
            "country": {"enum": ["France", "Germany", "Japan", "Brazil", "Canada"]},
            "languages": {"type": "array", "maxItems": 3,
                          "items": {"enum": ["English", "French", "German", "Japanese"]}},
            "active": {"type": "boolean"}}}),
    ("a weather report with fields city, date, temperature_c, conditions and wind", {
        "type": "object", "additionalProperties": False,
        "required": ["city", "date", "temperature_c", "conditions", "wind"],
        "properties": {
            "city": _STR, "date": {"type": "string", "maxLength": 10},
            "temperature_c": {"type": "integer", "minimum": -50, "maximum": 60},
            "conditions": {"enum": ["sunny", "cloudy", "rain", "snow", "fog"]},
            "wind": {"type": "object", "additionalProperties": False,
                     "required": ["speed_kmh", "direction"],
                     "properties": {"speed_kmh": {"type": "integer", "minimum": 0,
                                                  "maximum": 300},
                                    "direction": {"enum": ["N", "E", "S", "W"]}}}}}),
    ("a bug report with fields title, severity, component, steps and reproducible", {
        "type": "object", "additionalProperties": False,
        "required": ["title", "severity", "component", "steps", "reproducible"],
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "severity": {"enum": ["low", "medium", "high", "critical"]},
            "component": {"enum": ["parser", "server", "cli", "docs"]},
            "steps": {"type": "array", "minItems": 1, "maxItems": 3,
                      "items": {"type": "string", "maxLength": 30}},
            "reproducible": {"type": "boolean"}}}),
]


@dataclass(frozen=True)
class Workload:
    """A constrained workload: `requests(runner, compiler, n, max_tokens)` gives `n`
    (prompt ids, params with a grammar, schema to validate the output against)."""

    name: str
    requests: Callable[[Runner, GrammarCompiler, int, int],
                       list[tuple[list[int], SamplingParams, dict]]]


def json_schema_requests(runner: Runner, compiler: GrammarCompiler, n: int,
                         max_tokens: int) -> list[tuple[list[int], SamplingParams, dict]]:
    out = []
    for i in range(n):
        what, schema = SCHEMAS[i % len(SCHEMAS)]
        grammar = compiler.compile(ResponseFormat("json_schema", schema, f"schema{i}"))
        prompt = chat_prompt_ids(runner.tokenizer, [
            {"role": "user", "content": f"Make up {what}. Reply with the JSON object only."}])
        out.append((prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                           grammar=grammar), schema))
    return out


WORKLOADS: dict[str, Workload] = {"json-schema": Workload("json-schema", json_schema_requests)}
BASELINE = "free"  # the unconstrained cell every ratio is against


def compile_times(runner: Runner) -> dict:
    """Grammar compile time of every schema in `SCHEMAS` on a fresh compiler (ms), and the
    one-off vocabulary view build (s)."""
    compiler = GrammarCompiler(runner.tokenizer, runner.info.n_vocab)
    t0 = time.perf_counter()
    compiler.lltokenizer  # noqa: B018 - built once per model, before the first compile
    vocab_s = time.perf_counter() - t0
    seconds: list[float] = []
    for k, (_, schema) in enumerate(SCHEMAS):
        grammar = compiler.compile(ResponseFormat("json_schema", schema, f"s{k}"))
        seconds.append(grammar.compile_s)
    return {"vocab_view_s": round(vocab_s, 3), "compile_ms": percentiles(seconds),
            "schemas": len(seconds)}


def run_cell(runner: Runner, curve: StepTimeCurve, mode: str, context: int,
             requests: list[tuple[list[int], SamplingParams]], concurrency: int,
             forced_drafts: bool, overlap: bool | None = None) -> tuple[dict, list[dict]]:
    """Serve `requests`, `concurrency` at a time (in waves); (cell stats, per request
    {text, tokens, finish}). `overlap`: fill masks beside the runner (None: the engine's
    choice, `constrain.pipeline.spare_core`)."""
    runner.evict(list(range(runner.num_blocks)))  # nothing cached from an earlier cell
    config = EngineConfig(context_length=context, enable_prefix_caching=False,
                          scheduler=SchedulerConfig(max_num_seqs=runner.max_seqs,
                                                    max_num_batched_tokens=512))
    speculator = None
    if mode != "off":
        speculator = Speculator(SpecConfig(mode=mode, forced_drafts=forced_drafts), curve,
                                context, runner.capabilities.equal_split)
    engine = LLMEngine(runner, config, speculator=speculator)
    if overlap is not None:
        engine.masks.overlap = overlap
    per: dict[str, dict] = {}
    decode_tokens, decode_s = 0, 0.0
    reqs = []
    for w in range(0, len(requests), concurrency):
        wave = requests[w:w + concurrency]
        for i, (prompt, params) in enumerate(wave, w):
            reqs.append(engine.add_request(str(i), prompt, params))
        first = None
        count = 0
        while engine.has_work():
            for out in engine.step():
                got = per.setdefault(out.request_id, {"text": "", "tokens": []})
                got["text"] += out.text
                got["tokens"] += out.token_ids
                count += len(out.token_ids)
                if first is None:
                    first = time.perf_counter()
                if out.finished:
                    got["finish"] = out.finish_reason
        decode_tokens += count - len(wave)
        decode_s += time.perf_counter() - first
    engine.masks.close()
    generated = sum(len(r.output_ids) for r in reqs)
    forced = sum(r.metrics.num_accepted_forced_tokens for r in reqs)
    ms = engine.mask_stats
    cell = {
        "mask_overlap": engine.masks.overlap,
        "decode_tok_s": round(decode_tokens / decode_s, 2) if decode_s > 0 else None,
        "generated_tokens": generated,
        "draft_tokens": sum(r.metrics.num_draft_tokens for r in reqs),
        "accepted_tokens": sum(r.metrics.num_accepted_tokens for r in reqs),
        "forced_draft_tokens": sum(r.metrics.num_forced_draft_tokens for r in reqs),
        "forced_accepted_tokens": forced,
        "forced_share": round(forced / generated, 3) if generated else None,
    }
    if ms.count:
        total = [f + a for f, a in zip(ms.recent_fill_s, ms.recent_apply_s, strict=True)]
        cell["mask_ms_per_seq"] = {"fill": percentiles(list(ms.recent_fill_s)),
                                   "apply": percentiles(list(ms.recent_apply_s)),
                                   "total": percentiles(total)}
        cell["mask_wait_ms_total"] = round(ms.wait_s * 1e3, 2)
        cell["mask_fill_ms_total"] = round(ms.fill_s * 1e3, 2)
    return cell, [per[str(i)] for i in range(len(requests))]


def check_outputs(outputs: list[dict], schemas: list[dict]) -> dict:
    """How many outputs parse as JSON valid against their schema, how many ended by
    max_tokens, and how many of those in a run of whitespace (two or more whitespace
    characters last: what unbounded JSON whitespace does; a cut right after a single
    separator space is not counted)."""
    valid = 0
    for out, schema in zip(outputs, schemas, strict=True):
        try:
            jsonschema.validate(json.loads(out["text"]), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    in_ws = sum(1 for o in outputs if o["finish"] == "length" and len(o["text"]) >= 2
                and o["text"][-2:].isspace())
    return {"valid": valid, "outputs": len(outputs),
            "valid_pct": round(100 * valid / len(outputs), 1) if outputs else None,
            "length_in_whitespace_run": in_ws,
            "ended_by_length": sum(o["finish"] == "length" for o in outputs)}


def run_structured_bench(runner: Runner, curve: StepTimeCurve, workloads: list[str],
                         levels: list[int], mode: str, max_tokens: int,
                         emit: Callable[[dict], None]) -> list[dict]:
    """Every (constrained workload, concurrency): forced drafts on, off, and the free
    baseline; rows emitted as they are measured. Raises ValueError for an unknown
    workload."""
    unknown = [w for w in workloads if w not in WORKLOADS and w != BASELINE]
    if unknown:
        raise ValueError(f"unknown structured workload {unknown[0]!r}")
    context = min(runner.max_seq_tokens, 2048)
    compiler = GrammarCompiler(runner.tokenizer, runner.info.n_vocab)
    head = {"compile": compile_times(runner), "n_vocab": runner.info.n_vocab}
    emit(head)
    results = [head]
    for name in [w for w in workloads if w != BASELINE] or ["json-schema"]:
        for c in levels:
            n = SEQUENTIAL if c == 1 else c
            reqs = WORKLOADS[name].requests(runner, compiler, n, max_tokens)
            plain = [(p, params) for p, params, _ in reqs]
            on, outs_on = run_cell(runner, curve, mode, context, plain, c, True)
            off, outs_off = run_cell(runner, curve, mode, context, plain, c, False)
            # the other mask placement than the engine chose, forced drafts on
            other, _ = run_cell(runner, curve, mode, context, plain, c, True,
                                overlap=not on["mask_overlap"])
            # the baseline decodes exactly as many tokens per request, unconstrained
            free_reqs = [(p, SamplingParams(temperature=0, max_tokens=len(o["tokens"]),
                                            ignore_eos=True))
                         for (p, _), o in zip(plain, outs_off, strict=True)]
            free, _ = run_cell(runner, curve, mode, context, free_reqs, c, True)
            check = check_outputs(outs_on, [s for _, _, s in reqs])
            same = [o["tokens"] for o in outs_on] == [o["tokens"] for o in outs_off]
            base = free["decode_tok_s"]
            placement = "masks-beside-runner" if other["mask_overlap"] else "masks-inline"
            for label, cell in ((f"{name}+forced", on), (f"{name}+forced,{placement}", other),
                                (name, off), (BASELINE, free)):
                row = {"workload": label, "concurrency": c, "spec": mode, **cell,
                       "ratio_vs_free": ratio(cell["decode_tok_s"], base)}
                if label != BASELINE:
                    row.update(check, same_tokens_forced_on_off=same)
                emit(row)
                results.append(row)
    return results
