"""`tandem two-box plan --here`: this machine and the served model as the planner sees them.

- The model's shape (layers, heads, KV heads, head dim, hidden size, vocabulary, parameters,
  tied LM head, bytes per weight) is read from its GGUF; the KV dtype is `--kv-cache-type`,
  f16 (2 bytes per element) or q8_0 (34 per 32), what tandem's llama.cpp cache holds and the
  wire carries.
- This machine is measured with that model: the decode step is t(1) of the step-time curve
  (`app.spec_profile`, cached per machine, model, backend and threads, as `serve` uses it);
  the prefill is one `PREFILL_TOKENS`-token step, best of `PREFILL_REPEATS`, cached next to
  the curve. Both become a `planner.Device` whose "peaks" are the achieved FLOP/s and
  bytes/s (efficiencies 1.0), so the planner's arithmetic predicts this machine as measured.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from app.disagg.planner import GB, TFLOPS, Device, ModelShape, PlannerError
from backends.base import KV_TRANSFER_DTYPES, kv_row_bytes

PREFILL_TOKENS = 512  # one chunk, as the engine prefills (max_batch_tokens)
PREFILL_REPEATS = 2
DECODE_CONTEXT = 128  # the step-time curve's context (app.engine.spec_decode.profile)
# bytes per KV value, by --kv-cache-type (the wire's dtypes)
KV_BYTES = {t: kv_row_bytes(t, 32) / 32 for t in KV_TRANSFER_DTYPES}


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def model_shape(path: str | Path, name: str, kv_cache_type: str = "f16") -> ModelShape:
    """The planner's shape of the GGUF at `path`, its KV in `kv_cache_type` ("f16" or
    "q8_0": what the cache holds and the wire sends). Per-layer KV head counts (some hybrid
    models) count as their largest. Raises PlannerError if it is not a readable GGUF or
    lacks the keys."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:  # noqa: BLE001 - gguf raises bare ValueError/struct errors
        raise PlannerError(f"{path}: not a readable GGUF file ({e})") from None
    arch = str(_field(reader, "general.architecture", ""))
    layers = _field(reader, f"{arch}.block_count")
    heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    if not arch or None in (layers, heads, hidden):
        raise PlannerError(f"{path}: the GGUF lacks block_count, head_count or "
                           "embedding_length")
    heads = max(heads) if isinstance(heads, list) else int(heads)
    kv = _field(reader, f"{arch}.attention.head_count_kv", heads)
    kv = max(kv) if isinstance(kv, list) else int(kv)
    head_dim = int(_field(reader, f"{arch}.attention.key_length", int(hidden) // heads))
    tensors = {t.name: t for t in reader.tensors}
    params = sum(int(t.n_elements) for t in reader.tensors)
    weight_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    vocab = _field(reader, f"{arch}.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens",
                                                               []))
    return ModelShape(
        name=name, description=f"{name} ({Path(path).name})", params=params,
        layers=int(layers), heads=heads, kv_heads=kv, head_dim=head_dim, hidden=int(hidden),
        vocab=int(vocab), tied_embeddings="output.weight" not in tensors,
        weight_bytes_per_param=weight_bytes / params,
        kv_bytes_per_elem=KV_BYTES[kv_cache_type],
        source=f"read from {path}; KV {kv_cache_type}, tandem's cache and wire dtype")


@dataclass(frozen=True, slots=True)
class Measured:
    """This machine running the served model. decode_step_s: one decode step at
    DECODE_CONTEXT tokens of context. prefill_s: one step of `prefill_tokens` tokens from an
    empty cache. threads: llama.cpp threads (None: not a CPU backend). cached: read from
    the store rather than measured now."""

    backend: str
    threads: int | None
    decode_step_s: float
    prefill_tokens: int
    prefill_s: float
    cached: bool


def measure(model_path: Path, backend: str | None = None, threads: int | None = None,
            remeasure: bool = False) -> Measured:
    """Load the model and measure (or read the cached figures, keyed like the step-time
    curve: machine, model file, backend, threads; `remeasure` measures both again). A busy
    machine measures slow, and the figures are kept: measure on a quiet one. Raises
    ValueError / ImportError as `backends.loader.load_runner`."""
    from app.spec_profile import profile_key, step_time_curve
    from backends.base import RunnerConfig
    from backends.loader import load_runner
    from models.store import store_dir

    # one small slot: loads fast; the cache key (spec_profile.profile_key) is serve's all
    # the same, as it does not depend on slots or context
    runner, name = load_runner(model_path, backend=backend, config=RunnerConfig(
        max_seqs=1, seq_tokens=2 * PREFILL_TOKENS, n_threads=threads))
    try:
        n_threads = getattr(runner, "n_threads", None)
        cache = store_dir() / "profiles" / (
            f"here-{profile_key(model_path, name, runner)}.json")
        try:
            if not remeasure:
                saved = json.loads(cache.read_text())
                return Measured(name, n_threads, float(saved["decode_step_s"]),
                                int(saved["prefill_tokens"]), float(saved["prefill_s"]), True)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        decode = step_time_curve(runner, model_path, name, remeasure)[0](1)
        n, prefill = _time_prefill(runner)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"model": model_path.name, "backend": name,
                                         "decode_step_s": decode, "prefill_tokens": n,
                                         "prefill_s": prefill}, indent=1))
        except OSError:
            pass  # a read-only store only costs a re-measurement next time
        return Measured(name, n_threads, decode, n, prefill, False)
    finally:
        runner.close()


def _time_prefill(runner) -> tuple[int, float]:
    """(tokens, fastest seconds) of a prefill step from an empty cache in slot 0, logits
    for its last token only, as a real prompt's last chunk."""
    from backends.base import BatchItem

    n = min(PREFILL_TOKENS, runner.max_seq_tokens - 1,
            getattr(runner, "max_batch_tokens", PREFILL_TOKENS))
    bs = runner.block_size
    table = list(range(min(runner.num_blocks, -(-n // bs))))
    tokens = [1 + (i * 7919) % max(2, runner.info.n_vocab - 1) for i in range(n)]
    best = float("inf")
    try:
        for _ in range(PREFILL_REPEATS):
            t0 = time.perf_counter()
            runner.execute([BatchItem(0, tokens, 0, table, [n - 1])])
            best = min(best, time.perf_counter() - t0)
            runner.truncate(0, 0)
    finally:
        runner.truncate(0, 0)
        runner.release(0, 0)
    return n, best


def here_device(model: ModelShape, m: Measured) -> Device:
    """This machine as a planner device: the FLOP/s its prefill achieved and the bytes/s
    its decode step read (weights + DECODE_CONTEXT tokens of KV), efficiencies 1.0."""
    flops = model.prefill_flops(m.prefill_tokens) / m.prefill_s
    bandwidth = model.decode_bytes(DECODE_CONTEXT, 1) / m.decode_step_s
    cpu = platform.processor() or platform.machine()
    threads = f", {m.threads} thread{'s' * (m.threads != 1)}" if m.threads else ""
    return Device(
        name="here",
        description=f"this machine ({cpu}, {os.cpu_count()} cores{threads}, {m.backend})",
        memory_bandwidth_gbs=bandwidth / GB, fp16_tflops=flops / TFLOPS,
        compute_efficiency=1.0, bandwidth_efficiency=1.0,
        source=(f"{'cached (--remeasure to measure again)' if m.cached else 'measured now'} "
                f"with {model.name}: "
                f"prefill {m.prefill_tokens} tokens in {m.prefill_s:.3f} s "
                f"({m.prefill_tokens / m.prefill_s:,.0f} tok/s), decode "
                f"{m.decode_step_s * 1e3:.1f} ms/token"))
