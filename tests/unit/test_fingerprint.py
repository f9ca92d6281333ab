"""models/fingerprint.py: exact fingerprints of tiny GGUF files written here, the field that
differs named first, the dict form the wire carries, and the embedded model's values."""

from __future__ import annotations

import hashlib

import gguf
import numpy as np
import pytest

from models.fingerprint import (
    FIELDS,
    ModelFingerprint,
    fingerprint_gguf,
    first_difference,
    vocab_hash,
)


def _write(path, *, kv_heads=2, theta=10000.0, tokens=("a", "b", "c"), scaling=None,
           weight=1.0):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(16)
    w.add_head_count(4)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    if scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(tokens))
    w.add_tensor("token_embd.weight", np.full((3, 16), weight, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fingerprint_of_a_tiny_gguf(tmp_path):
    path = _write(tmp_path / "m.gguf")
    fp = fingerprint_gguf(path)
    assert fp == ModelFingerprint(
        architecture="llama", n_layers=2, n_kv_heads=2, head_dim=4, rope_base=10000.0,
        rope_scaling="none", vocab_hash=vocab_hash(["a", "b", "c"], "gpt2"),
        weights_digest=hashlib.sha256(path.read_bytes()).hexdigest())
    assert fingerprint_gguf(path, weights_digest="ab" * 32).weights_digest == "ab" * 32


def test_vocab_hash_is_length_prefixed():
    h = hashlib.sha256(b"\x04\0\0\0gpt2" b"\x01\0\0\0a" b"\x02\0\0\0bc").hexdigest()
    assert vocab_hash(["a", "bc"], "gpt2") == h
    assert vocab_hash(["ab", "c"], "gpt2") != h  # same concatenation, other vocabulary


@pytest.mark.parametrize("change, field", [
    ({"kv_heads": 1}, "n_kv_heads"),
    ({"theta": 500000.0}, "rope_base"),
    ({"scaling": 4.0}, "rope_scaling"),
    ({"tokens": ("a", "b", "d")}, "vocab_hash"),
    ({"weight": 2.0}, "weights_digest"),
    ({"kv_heads": 1, "tokens": ("x", "y", "z")}, "n_kv_heads"),  # the first one is named
])
def test_first_difference_names_the_field(tmp_path, change, field):
    a = fingerprint_gguf(_write(tmp_path / "a.gguf"))
    b = fingerprint_gguf(_write(tmp_path / "b.gguf", **change))
    assert first_difference(a, b) == field
    assert first_difference(a, a) is None


def test_scaling_is_spelled_out(tmp_path):
    assert fingerprint_gguf(_write(tmp_path / "s.gguf", scaling=4.0)).rope_scaling == \
        "linear:4.0:0"


def test_dict_round_trip_and_malformed():
    fp = ModelFingerprint("llama", 30, (3, 3), 64, 1e5, "none", "0" * 64, "1" * 64)
    d = fp.to_dict()
    assert list(d) == list(FIELDS) and d["n_kv_heads"] == [3, 3]
    assert ModelFingerprint.from_dict(d) == fp
    with pytest.raises(ValueError, match="malformed"):
        ModelFingerprint.from_dict({k: v for k, v in d.items() if k != "head_dim"})
    with pytest.raises(ValueError, match="malformed"):
        ModelFingerprint.from_dict({**d, "n_layers": "thirty"})


def test_not_a_gguf(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        fingerprint_gguf(tmp_path / "x.gguf")
    with pytest.raises(FileNotFoundError):
        fingerprint_gguf(tmp_path / "missing.gguf")


def test_embedded_model_fingerprint(embedded_model):
    from models.registry import DEFAULT_MODEL, get_entry

    sha = get_entry(DEFAULT_MODEL).sha256
    fp = fingerprint_gguf(embedded_model, weights_digest=sha)
    assert (fp.architecture, fp.n_layers, fp.n_kv_heads, fp.head_dim, fp.rope_base,
            fp.rope_scaling) == ("llama", 30, 3, 64, 100000.0, "none")
    assert fp.vocab_hash == "30617df647368cfdb25b952fe725b04c32732d1c1903d5f3036c543d113357b8"
    assert fp.weights_digest == sha
