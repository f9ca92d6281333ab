"""backends/llamacpp/kv_transfer.py on synthetic data: exact blob bytes, the per-head K
permutation of NORM-rope (llama) models, and the identity for NEOX-rope (qwen2) models."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from backends.base import Q8_0_BLOCK
from backends.llamacpp import kv_transfer as kvt


def _state(positions, n_layers=2, heads=1, dim=4, v_trans=False, n_stream=1, stream=0):
    cells = len(positions)
    base = np.arange(n_layers * cells * heads * dim, dtype=np.float16)
    keys = [base[i * cells * heads * dim:(i + 1) * cells * heads * dim].reshape(cells, heads, dim)
            for i in range(n_layers)]
    values = [-k for k in keys]
    return kvt.SeqState(7, n_stream, stream, np.asarray(positions, np.int32), v_trans, keys,
                        values)


def test_golden_blob_bytes():
    """One layer, one head of 2 dims, positions 5 and 4 in cell order (V transposed)."""
    k = np.array([[[1.0, 2.0]], [[3.0, 4.0]]], np.float16)
    v = np.array([[[-1.0, -2.0]], [[-3.0, -4.0]]], np.float16)
    state = kvt.SeqState(3, 2, 1, np.array([5, 4], np.int32), True, [k], [v])
    blob = bytes(kvt.build_state(state))
    want = (struct.pack("<IiI", 0xAF143CD8, 3, 2) + struct.pack("<I", 0)  # stream 0: empty
            + struct.pack("<I", 2) + struct.pack("<iIi", 5, 1, 3) + struct.pack("<iIi", 4, 1, 3)
            + struct.pack("<II", 1, 1)
            + struct.pack("<iQ", 1, 4) + np.array([1, 2, 3, 4], "<f2").tobytes()
            # V transposed: [dim][cell]
            + struct.pack("<iII", 1, 2, 2) + np.array([-1, -3, -2, -4], "<f2").tobytes())
    assert blob == want
    assert blob.hex()[:24] == "d83c14af0300000002000000"
    back = kvt.parse_state(blob, 1, 2)
    assert (back.seq_id, back.n_stream, back.stream, back.v_trans) == (3, 2, 1, True)
    assert back.positions.tolist() == [5, 4]
    assert np.array_equal(back.keys[0], k) and np.array_equal(back.values[0], v)
    # to neutral: position order (4, 5)
    (nk, nv), = kvt.to_neutral(back, 4, 2, interleaved=False)
    assert nk[:, 0].tolist() == [[3.0, 4.0], [1.0, 2.0]]
    assert nv[:, 0].tolist() == [[-3.0, -4.0], [-1.0, -2.0]]


@pytest.mark.parametrize("v_trans", [False, True])
def test_parse_then_build_is_the_identity(v_trans):
    blob = bytes(kvt.build_state(_state([0, 1, 2], heads=3, dim=4, v_trans=v_trans)))
    assert bytes(kvt.build_state(kvt.parse_state(blob, 3, 4))) == blob


def test_deinterleave_moves_rotary_pairs_to_halves():
    k = np.arange(8, dtype=np.float16).reshape(1, 1, 8)
    assert kvt.deinterleave_heads(k)[0, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert kvt.interleave_heads(kvt.deinterleave_heads(k)).tolist() == k.tolist()
    # partial rotary: only the first n_rot dims are pairs
    assert kvt.deinterleave_heads(k, n_rot=4)[0, 0].tolist() == [0, 2, 1, 3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="even"):
        kvt.deinterleave_heads(k, n_rot=3)


def test_interleave_is_the_gguf_converters_row_permutation():
    """conversion/llama.py LlamaModel.permute on one head's K rows, as a function of rows."""
    n_head, d = 3, 8
    w = np.arange(n_head * d, dtype=np.float16).reshape(n_head * d, 1)
    permuted = w.reshape(n_head, 2, d // 2, 1).swapaxes(1, 2).reshape(w.shape)
    ours = kvt.interleave_heads(w.reshape(n_head, d)).reshape(n_head * d, 1)
    assert np.array_equal(ours, permuted)


def _rope_half(x, pos, base):  # Hugging Face rotate_half, x: [tokens, d]
    d = x.shape[-1]
    ang = pos[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], -1)
    return x * cos + rot * sin


def _rope_norm(x, pos, base):  # llama.cpp NORM: adjacent pairs (2i, 2i+1)
    d = x.shape[-1]
    ang = pos[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    out = np.empty_like(x)
    out[:, 0::2] = x[:, 0::2] * cos - x[:, 1::2] * sin
    out[:, 1::2] = x[:, 0::2] * sin + x[:, 1::2] * cos
    return out


def test_norm_rope_on_permuted_k_deinterleaves_to_rotate_half_rope():
    """Why de-interleaving post-RoPE K is exact: NORM on the GGUF-permuted K equals
    rotate-half on the HF K, element for element."""
    rng = np.random.default_rng(0)
    x_hf = rng.standard_normal((5, 64))
    pos = np.arange(5, dtype=np.float64) + 100
    stored = _rope_norm(kvt.interleave_heads(x_hf), pos, 100000.0)
    assert np.array_equal(kvt.deinterleave_heads(stored), _rope_half(x_hf, pos, 100000.0))


def test_llama_state_to_neutral_and_back():
    """llama arch: the neutral K is the de-interleaved cell; rebuilding gives the same blob."""
    state = _state([0, 1, 2], heads=2, dim=4)
    blob = bytes(kvt.build_state(state))
    kv = kvt.to_neutral(kvt.parse_state(blob, 2, 4), 0, 3, interleaved=True)
    assert kv[0][0][0, 0].tolist() == [0, 2, 1, 3]
    assert np.array_equal(kv[1][1], state.values[1])  # V is never permuted
    back = kvt.from_neutral(kv, 0, seq_id=7, n_stream=1, stream=0, v_trans=False,
                            interleaved=True)
    assert bytes(kvt.build_state(back)) == blob


def test_qwen2_state_to_neutral_is_the_stored_cells():
    """NEOX rope (qwen2): no permutation, the neutral K is the cell as stored."""
    assert kvt.rope_interleaved(kvt.ROPE_TYPE_NEOX) is False
    assert kvt.rope_interleaved(kvt.ROPE_TYPE_NORM) is True
    with pytest.raises(ValueError, match="rope type 8"):
        kvt.rope_interleaved(8)  # M-RoPE
    state = _state([2, 0, 1], heads=2, dim=4)
    kv = kvt.to_neutral(state, 0, 3, interleaved=False)
    assert np.array_equal(kv[0][0], state.keys[0][[1, 2, 0]])
    back = kvt.from_neutral(kv, 0, seq_id=7, n_stream=1, stream=0, v_trans=False,
                            interleaved=False)
    assert np.array_equal(back.keys[0], kv[0][0]) and back.positions.tolist() == [0, 1, 2]


def test_concat_appends_a_chunk():
    head, tail = _state([0, 1]), _state([2])
    both = kvt.concat_states(head, tail)
    assert both.positions.tolist() == [0, 1, 2]
    assert np.array_equal(np.concatenate(both.keys[1])[2], tail.keys[1][0])
    # written as one sequence: the blob of the concatenation is the blob of all three cells
    for v_trans in (False, True):
        h, t = _state([0, 1], v_trans=v_trans), _state([2], v_trans=v_trans)
        whole = kvt.SeqState(t.seq_id, t.n_stream, t.stream, np.array([0, 1, 2], np.int32),
                             v_trans, [np.concatenate([a, b]) for a, b in zip(h.keys, t.keys, strict=True)],
                             [np.concatenate([a, b]) for a, b in zip(h.values, t.values, strict=True)])
        assert bytes(kvt.build_state(kvt.concat_states(h, t))) == bytes(kvt.build_state(whole))
    assert kvt.concat_states(kvt.SeqState(7, 1, None, np.zeros(0, np.int32), False, [], []),
                             tail) is tail
    with pytest.raises(ValueError, match="different context layouts"):
        kvt.concat_states(head, _state([2], v_trans=True))


def test_malformed_blobs_are_refused():
    blob = bytes(kvt.build_state(_state([0, 1])))
    with pytest.raises(ValueError, match="magic"):
        kvt.parse_state(b"\0" * 4 + blob[4:], 1, 4)
    with pytest.raises(ValueError, match="truncated"):
        kvt.parse_state(blob[:-1], 1, 4)
    with pytest.raises(ValueError, match="unexpected bytes"):
        kvt.parse_state(blob + b"\0", 1, 4)
    with pytest.raises(ValueError, match="row is 8 bytes, the model shape implies 16"):
        kvt.parse_state(blob, 2, 4)
    k_type_at = 12 + 4 + 2 * 12 + 8
    for ggml_type, match in [(2, "K cache type 2 is not f16 or q8_0"),
                             (8, "q8_0 KV needs kv_heads \\* head_dim divisible by 32, not 4")]:
        other = bytearray(blob)
        other[k_type_at:k_type_at + 4] = struct.pack("<i", ggml_type)
        with pytest.raises(ValueError, match=match):
            kvt.parse_state(bytes(other), 1, 4)
    two = bytes(kvt.build_state(_state([0], n_stream=2, stream=0)))
    two = two[:-4] + bytes(kvt.build_state(_state([0], n_stream=1)))[12:]  # stream 1 too
    with pytest.raises(ValueError, match="more than one stream"):
        kvt.parse_state(two, 1, 4)
    with pytest.raises(ValueError, match="does not hold positions 0..2"):
        kvt.to_neutral(_state([0, 1]), 0, 3, interleaved=False)
    with pytest.raises(ValueError, match="twice"):
        kvt.to_neutral(_state([0, 0]), 0, 1, interleaved=False)


def _q8_0(values: np.ndarray) -> np.ndarray:
    """Blocks of 32 with d = 0.5 and quants `values` (int8), shape [cells, blocks]."""
    blocks = np.zeros(values.shape[:-1] + (values.shape[-1] // 32,), Q8_0_BLOCK)
    blocks["d"] = 0.5
    blocks["qs"] = values.reshape(blocks.shape + (32,))
    return blocks


def test_q8_0_blob_bytes_and_round_trip():
    """A q8_0 cache: one layer, 2 KV heads of 32 dims (2 blocks per token), positions 1 and 0
    in cell order. Rows are llama.cpp's block_q8_0 (f16 d, 32 int8), K kept in cache order
    even for an interleaved (NORM) model."""
    q = (np.arange(2 * 64) % 97 - 48).astype(np.int8).reshape(2, 64)
    k, v = _q8_0(q), _q8_0(-q)
    state = kvt.SeqState(3, 1, 0, np.array([1, 0], np.int32), False, [k], [v])
    blob = bytes(kvt.build_state(state))

    def rows(quants):
        return b"".join(np.float16(0.5).tobytes() + quants[c, 32 * b:32 * b + 32].tobytes()
                        for c in range(2) for b in range(2))
    want = (struct.pack("<IiI", 0xAF143CD8, 3, 1) + struct.pack("<I", 2)
            + struct.pack("<iIi", 1, 1, 3) + struct.pack("<iIi", 0, 1, 3)
            + struct.pack("<II", 0, 1)
            + struct.pack("<iQ", 8, 68) + rows(q) + struct.pack("<iQ", 8, 68) + rows(-q))
    assert blob == want
    back = kvt.parse_state(blob, 2, 32)
    assert back.keys[0].dtype == Q8_0_BLOCK and back.keys[0].shape == (2, 2)
    (nk, nv), = kvt.to_neutral(back, 0, 2, interleaved=True, n_rot=32)
    assert nk["qs"].reshape(2, 64).tolist() == [q[1].tolist(), q[0].tolist()]  # not permuted
    assert nv["qs"].reshape(2, 64).tolist() == [(-q[1]).tolist(), (-q[0]).tolist()]
    again = kvt.from_neutral([(nk, nv)], 0, seq_id=3, n_stream=1, stream=0, v_trans=False,
                             interleaved=True, n_rot=32)
    assert bytes(kvt.build_state(again)) == bytes(kvt.build_state(
        kvt.SeqState(3, 1, 0, np.array([0, 1], np.int32), False, [k[::-1]], [v[::-1]])))
    with pytest.raises(ValueError, match="a transposed V must be f16"):
        kvt.build_state(kvt.SeqState(3, 1, 0, np.array([0], np.int32), True, [k[:1]], [v[:1]]))
    with pytest.raises(ValueError, match="every K and V must be q8_0"):
        kvt.from_neutral([(nk, nv.astype(Q8_0_BLOCK)), (nk, _q8_0(q)[:, :1])], 0, seq_id=0,
                         n_stream=1, stream=0, v_trans=False, interleaved=False)
