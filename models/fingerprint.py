"""A model's fingerprint for the two-box mode: what must match for KV computed on one box to
be valid on the other, read from the GGUF (through `gguf`), whichever backend loads it.

Fields, compared in this order (`first_difference` names the first that differs):
architecture, n_layers, n_kv_heads, head_dim (shape of the KV), rope_base and rope_scaling
(K is exchanged post-RoPE, so both boxes must rotate alike), vocab_hash (token ids mean the
same text), weights_digest (sha256 of the whole GGUF file: the same weights give the same KV;
equal to the model store's sha256, so a verified store entry need not be hashed again).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

FIELDS = ("architecture", "n_layers", "n_kv_heads", "head_dim", "rope_base", "rope_scaling",
          "vocab_hash", "weights_digest")
_HASH_CHUNK = 1 << 20  # bytes read per update while hashing the file


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """architecture: GGUF `general.architecture`. n_layers, n_kv_heads (a list where it varies
    per layer), head_dim: KV shape. rope_base: RoPE base frequency. rope_scaling:
    "type:factor:original_context" ("none" when unscaled). vocab_hash, weights_digest:
    lowercase sha256 hex."""

    architecture: str
    n_layers: int
    n_kv_heads: int | tuple[int, ...]
    head_dim: int
    rope_base: float
    rope_scaling: str
    vocab_hash: str
    weights_digest: str

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (for msgpack): tuples become lists."""
        d = asdict(self)
        if isinstance(d["n_kv_heads"], tuple):
            d["n_kv_heads"] = list(d["n_kv_heads"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelFingerprint:
        """Inverse of `to_dict`. Raises ValueError for missing fields, wrong types or
        infinite numbers."""
        try:
            kv = d["n_kv_heads"]
            fp = cls(str(d["architecture"]), int(d["n_layers"]),
                     tuple(int(x) for x in kv) if isinstance(kv, list | tuple) else int(kv),
                     int(d["head_dim"]), float(d["rope_base"]), str(d["rope_scaling"]),
                     str(d["vocab_hash"]), str(d["weights_digest"]))
        except (KeyError, TypeError, ValueError, OverflowError) as e:  # int(inf) overflows
            raise ValueError(f"malformed model fingerprint: {e!r}") from e
        return fp


def first_difference(a: ModelFingerprint, b: ModelFingerprint) -> str | None:
    """Name of the first field (in `FIELDS` order) where `a` and `b` differ, else None."""
    for f in fields(ModelFingerprint):
        if getattr(a, f.name) != getattr(b, f.name):
            return f.name
    return None


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, lowercase hex (reads the whole file)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def vocab_hash(tokens: list[str], model: str) -> str:
    """sha256 over the tokenizer model name and every token, each length-prefixed (u32 LE), so
    no two vocabularies hash alike by shifting text between neighbours."""
    h = hashlib.sha256()
    for text in [model, *tokens]:
        b = text.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(4, "little") + b)
    return h.hexdigest()


def fingerprint_gguf(path: str | Path, weights_digest: str | None = None) -> ModelFingerprint:
    """Fingerprint of a GGUF file. `weights_digest`: the file's known sha256 (e.g. from the
    model store's verified entry); None hashes the file (about a second per GB).

    Raises FileNotFoundError; ValueError if it is not a GGUF or lacks the shape keys."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except FileNotFoundError:
        raise
    except Exception as e:  # gguf raises bare ValueError/struct errors on foreign files
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e
    arch = str(_field(reader, "general.architecture", ""))
    n_layers = _field(reader, f"{arch}.block_count")
    n_head = _field(reader, f"{arch}.attention.head_count")
    if not arch or n_layers is None or n_head is None:
        raise ValueError(f"{path}: GGUF lacks architecture, block_count or head_count")
    if isinstance(n_head, list):  # per-layer head counts: head_dim from the first layer
        n_head = n_head[0]
    kv = _field(reader, f"{arch}.attention.head_count_kv", n_head)
    kv = tuple(int(x) for x in kv) if isinstance(kv, list) else int(kv)
    head_dim = _field(reader, f"{arch}.attention.key_length")
    if head_dim is None:
        head_dim = int(_field(reader, f"{arch}.embedding_length")) // int(n_head)
    scaling = str(_field(reader, f"{arch}.rope.scaling.type", "none"))
    if scaling != "none":
        factor = _field(reader, f"{arch}.rope.scaling.factor", 1.0)
        orig = _field(reader, f"{arch}.rope.scaling.original_context_length", 0)
        scaling = f"{scaling}:{float(factor)!r}:{int(orig)}"
    return ModelFingerprint(
        architecture=arch, n_layers=int(n_layers), n_kv_heads=kv, head_dim=int(head_dim),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        vocab_hash=vocab_hash([str(t) for t in _field(reader, "tokenizer.ggml.tokens", [])],
                              str(_field(reader, "tokenizer.ggml.model", ""))),
        weights_digest=weights_digest or file_sha256(path))
