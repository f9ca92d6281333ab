"""The paged KV pool behind mlx-lm's models: ragged batches, shared prefixes, rollback,
KV export/import. Each check compares the runner against itself computing alone/afresh."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from backends.base import BatchItem  # noqa: E402

ATOL = 2e-3  # f32 on CPU; batch shape changes the matmul reduction order only


def _alone(runner, ids, blocks, start=0):
    return runner.execute([BatchItem(3, ids, start, blocks, [len(ids) - 1])])[0]


@pytest.mark.parametrize("one_forward", [False, True])
def test_ragged_batch_equals_each_row_alone(mlx_runner, monkeypatch, one_forward):
    if one_forward:  # all rows padded into a single forward instead of grouped
        monkeypatch.setattr("backends.mlx.runner._MAX_PAD_WASTE", 1.0)
    tok = mlx_runner.tokenizer
    a = tok.encode("Once upon a time, in a small village")
    b = tok.encode("import numpy as np")
    c = tok.encode("Water boils at")
    # b: prefilled earlier; this step decodes one token. c: second chunk of a prefill.
    mlx_runner.execute([BatchItem(1, b, 0, [4, 5], [])])
    mlx_runner.execute([BatchItem(2, c[:2], 0, [6], [])])
    b_next = 13  # any token id
    got = mlx_runner.execute([
        BatchItem(0, a, 0, [0, 1], [0, len(a) - 1]),
        BatchItem(1, [b_next], len(b), [4, 5], [0]),
        BatchItem(2, c[2:], 2, [6], [len(c) - 3]),
    ])
    assert got.shape == (4, mlx_runner.info.n_vocab)
    want_a0 = _alone(mlx_runner, a[:1], [20])
    want_a = _alone(mlx_runner, a, [20, 21])
    want_b = _alone(mlx_runner, [*b, b_next], [22, 23])
    want_c = _alone(mlx_runner, c, [24])
    for g, w in zip(got, [want_a0, want_a, want_b, want_c], strict=True):
        assert int(np.argmax(g)) == int(np.argmax(w))
        np.testing.assert_allclose(g, w, atol=ATOL)


def test_forked_prefix_equals_recomputed(mlx_runner):
    tok = mlx_runner.tokenizer
    prefix = tok.encode("The following is a list of the largest cities in Europe by pop")
    prefix = (prefix * 2)[:16]  # exactly one full block
    assert len(prefix) == 16
    suffix = tok.encode(" ulation:")
    mlx_runner.execute([BatchItem(0, prefix, 0, [8], [])])
    # slot 1 takes block 8 as its first block and computes only the suffix
    mlx_runner.share_blocks(1, [8])
    forked = mlx_runner.execute([BatchItem(1, suffix, 16, [8, 9], [len(suffix) - 1])])[0]
    recomputed = _alone(mlx_runner, prefix + suffix, [10, 11])
    np.testing.assert_allclose(forked, recomputed, atol=ATOL)
    assert int(np.argmax(forked)) == int(np.argmax(recomputed))


def _greedy(runner, slot, ids, blocks, n):
    row = runner.execute([BatchItem(slot, ids, 0, blocks, [len(ids) - 1])])[0]
    out = [int(np.argmax(row))]
    for _ in range(n - 1):
        row = runner.execute([BatchItem(slot, [out[-1]], len(ids) + len(out) - 1, blocks,
                                        [0])])[0]
        out.append(int(np.argmax(row)))
    return out


def test_truncate_then_redecode_reproduces_tokens(mlx_runner):
    ids = mlx_runner.tokenizer.encode("My favourite colour is")
    blocks = [12, 13]
    first = _greedy(mlx_runner, 0, ids, blocks, 4)
    # a rejected draft: verify [t0, wrong, wrong] in one step, keep only t0
    n = len(ids)
    mlx_runner.execute([BatchItem(0, [first[0], 1000, 1001], n, blocks, [0, 1, 2])])
    mlx_runner.truncate(0, n + 1)
    again = [first[0]]
    for _ in range(3):
        row = mlx_runner.execute([BatchItem(0, [again[-1]], n + len(again) - 1, blocks,
                                            [0])])[0]
        again.append(int(np.argmax(row)))
    assert again == first


def test_export_import_round_trip(mlx_runner):
    ids = mlx_runner.tokenizer.encode("Bonjour, je m'appelle")
    n = len(ids)
    mlx_runner.execute([BatchItem(0, ids[:-1], 0, [14], [])])
    kv = mlx_runner.export_kv(0, [14], 0, n - 1)
    info = mlx_runner.info
    assert len(kv) == info.n_layers
    assert kv[0][0].shape == (n - 1, info.n_kv_heads, info.head_dim)
    assert kv[0][0].dtype == np.float16
    mlx_runner.import_kv(1, [15], 0, kv)
    # the last prompt token computed on imported KV == computed on the original KV
    # (the original was f32; the wire format is f16, so allow f16 rounding)
    on_import = mlx_runner.execute([BatchItem(1, ids[-1:], n - 1, [15], [0])])[0]
    on_orig = mlx_runner.execute([BatchItem(0, ids[-1:], n - 1, [14], [0])])[0]
    assert int(np.argmax(on_import)) == int(np.argmax(on_orig))
    np.testing.assert_allclose(on_import, on_orig, atol=0.1)
    with pytest.raises(ValueError):
        mlx_runner.import_kv(1, [15], 0, kv[:-1])


def test_rejects_bad_batches(mlx_runner):
    with pytest.raises(ValueError):
        mlx_runner.execute([BatchItem(0, [1, 2], 0, [], [1])])  # no blocks
    with pytest.raises(ValueError):
        mlx_runner.execute([BatchItem(0, [1], 0, [mlx_runner.num_blocks], [0])])
    with pytest.raises(ValueError):
        mlx_runner.execute([BatchItem(0, [1], 0, [0], [1])])  # logits index past tokens
    assert mlx_runner.execute([]).shape == (0, mlx_runner.info.n_vocab)
