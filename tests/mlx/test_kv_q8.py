"""`--kv-cache-type q8_0` on MLX: pools quantized with MLX's affine 8 bits (group 64) against
the f16 runner (f32 activations and KV on CPU) on the embedded model. Greedy tokens equal,
logits move by a small measured amount, the pools take 0.53x the bytes of f16, a forked
prefix reads back as recomputed, and KV transfer (two-box mode) is refused."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from app.config import EngineArgs  # noqa: E402
from app.disagg.peer import PeerConfig  # noqa: E402
from backends.base import BatchItem, RunnerConfig  # noqa: E402

PROMPTS = ["The capital of France is Paris. The capital of Italy is",
           "def add(a, b):\n    return"]
STEPS = 8
# measured on CPU over PROMPTS: max |Δ logit| 0.33, max KL 0.0012 nats (mean 0.0003)
MAX_ABS_DELTA = 1.0
MAX_KL = 0.005
TRANSFER_REFUSAL = ("two-box mode sends f16 or llama.cpp's q8_0 KV; --kv-cache-type q8_0 on "
                    "the MLX backend (MLX 8-bit affine) is not supported")


def _greedy(runner, ids: list[int], blocks: list[int]) -> tuple[list[int], np.ndarray]:
    """`STEPS` greedy tokens after `ids` (slot 0) and the logits row of each step."""
    rows = [runner.execute([BatchItem(0, ids, 0, blocks, [len(ids) - 1])])[0].copy()]
    toks = [int(np.argmax(rows[-1]))]
    for i in range(STEPS - 1):
        rows.append(runner.execute([BatchItem(0, [toks[-1]], len(ids) + i, blocks, [0])])[0]
                    .copy())
        toks.append(int(np.argmax(rows[-1])))
    return toks, np.array(rows)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(p) || softmax(q)) in nats per row."""
    def log_softmax(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_f16_and_logits_move_a_little(mlx_runner, mlx_q8_runner, prompt):
    ids = mlx_runner.tokenizer.encode(prompt, add_special=True)
    assert len(ids) <= 32
    want, f16 = _greedy(mlx_runner, ids, [0, 1])
    got, q8 = _greedy(mlx_q8_runner, ids, [0, 1])
    delta, kl = float(np.abs(f16 - q8).max()), _kl(f16, q8)
    print(f"\nq8_0 vs f16 over {STEPS} steps: max |Δ logit| {delta:.4f}, KL max "
          f"{kl.max():.5f} mean {kl.mean():.5f} nats")
    assert got == want
    assert 0 < delta < MAX_ABS_DELTA  # > 0: the pool really is quantized
    assert kl.max() < MAX_KL


def test_pool_bytes_are_053x_f16(mlx_q8_runner):
    info, r = mlx_q8_runner.info, mlx_q8_runner
    n_rows = r.num_blocks * r.block_size + 1  # + the trash row
    values = n_rows * info.n_layers * 2 * info.n_kv_heads * info.head_dim  # K and V
    # per 64 values: 64 int8 in uint32 words, an f16 scale and an f16 bias
    assert r.kv_bytes == values + values // 64 * 4 == 6_279_120
    assert r.kv_bytes / (2 * values) == 68 / 128  # 0.53x two bytes a value
    print(f"\nq8_0 pool: {r.kv_bytes / n_rows:.0f} bytes per token, f16 {2 * values / n_rows:.0f}")
    assert r.kv_cache_type == "q8_0"


def test_forked_prefix_gives_the_recomputed_tokens(mlx_runner, mlx_q8_runner):
    """A shared prefix block (the prefix cache's path: `share_blocks`, no copy) read by
    another slot gives the tokens of the prefix recomputed, in q8_0 and in f16."""
    r = mlx_q8_runner
    prefix = r.tokenizer.encode("The following is a list of the largest cities in Europe by pop")
    prefix = (prefix * 2)[:16]  # exactly one full block
    suffix = r.tokenizer.encode(" ulation:")
    r.execute([BatchItem(0, prefix, 0, [8], [])])
    r.share_blocks(1, [8])  # slot 1 takes block 8 as its first block, computes the suffix
    forked = [r.execute([BatchItem(1, suffix, 16, [8, 9], [len(suffix) - 1])])[0].copy()]
    recomputed = [r.execute([BatchItem(2, prefix + suffix, 0, [10, 11],
                                       [15 + len(suffix)])])[0].copy()]
    f16 = [mlx_runner.execute([BatchItem(2, prefix + suffix, 0, [10, 11],
                                         [15 + len(suffix)])])[0].copy()]
    for rows, runner, slot, blocks in ((forked, r, 1, [8, 9]), (recomputed, r, 2, [10, 11]),
                                       (f16, mlx_runner, 2, [10, 11])):
        for i in range(3):
            rows.append(runner.execute([BatchItem(slot, [int(np.argmax(rows[-1]))],
                                                  16 + len(suffix) + i, blocks, [0])])[0]
                        .copy())
    delta = float(np.abs(np.array(forked) - np.array(recomputed)).max())
    print(f"\nforked vs recomputed prefix (q8_0): max |Δ logit| {delta:.5f}")
    tokens = [[int(np.argmax(x)) for x in rows] for rows in (forked, recomputed, f16)]
    assert tokens[0] == tokens[1] == tokens[2]
    assert delta < 0.05


def test_group_size_divides_the_head_dim():
    import mlx.core as mx

    from backends.mlx.paged_cache import QuantizedPagedLayerCache, kv_group_size

    assert (kv_group_size(64), kv_group_size(128, 128), kv_group_size(96)) == (64, 64, 32)
    with pytest.raises(ValueError, match="^--kv-cache-type q8_0 on MLX needs head dims "
                                         "divisible by 32, not 80$"):
        kv_group_size(80)
    cache = QuantizedPagedLayerCache(5, 2, 96, mx.float32)  # groups of 32
    x = mx.array(np.random.default_rng(0).normal(size=(2, 2, 96)).astype(np.float32))
    rows = mx.array([1, 3])
    cache.write(rows, x, -x)
    k, v = cache.read(rows)
    step = float((x.max(axis=-1) - x.min(axis=-1)).max()) / 255  # one 8-bit step
    assert float(mx.abs(k - x).max()) < step and float(mx.abs(v + x).max()) < step


def test_kv_transfer_is_refused(mlx_q8_runner):
    r = mlx_q8_runner
    assert not r.capabilities.kv_transfer
    with pytest.raises(ValueError) as err:
        r.export_kv(0, [0], 0, 1)
    assert str(err.value) == TRANSFER_REFUSAL
    shape = (1, r.info.n_kv_heads, r.info.head_dim)
    kv = [(np.zeros(shape, np.float16), np.zeros(shape, np.float16))] * r.info.n_layers
    with pytest.raises(ValueError) as err:
        r.import_kv(0, [0], 0, kv)
    assert str(err.value) == TRANSFER_REFUSAL


@pytest.mark.parametrize("side", ["decode box", "prefill worker"])
def test_two_box_refuses_an_automatically_chosen_mlx_backend(gguf_path, monkeypatch, side):
    """Backend not given: the refusal comes after loading, once MLX is the choice."""
    from app.loader import load_engine, load_prefill_engine
    from backends import loader

    monkeypatch.setattr(loader, "_choose", lambda requested: "mlx")
    runner = RunnerConfig(max_seqs=1, seq_tokens=256, kv_tokens=256, kv_cache_type="q8_0")
    if side == "decode box":
        peer = PeerConfig("127.0.0.1", 7070, b"")
        call, args, where = load_engine, EngineArgs(model=gguf_path, runner=runner,
                                                    prefill_peer=peer), "with --prefill-peer"
    else:
        call, args, where = (load_prefill_engine, EngineArgs(model=gguf_path, runner=runner),
                             "by prefill-worker")
    with pytest.raises(ValueError) as err:
        call(args, pull_missing=False)
    assert str(err.value) == f"{TRANSFER_REFUSAL} {where}"
