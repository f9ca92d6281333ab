"""Tokenizer for the MLX backend, built with Hugging Face `tokenizers`.

Two sources:
- GGUF metadata (`tokenizer.ggml.*`): a byte-level BPE ("gpt2" model) rebuilt from the token
  list, the merges and the pre-tokenizer regexes llama.cpp uses for the file's `pre` type
  (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`), so ids match llama.cpp's tokenizer;
- a Hugging Face / mlx-community / converted directory (`tokenizer.json` +
  `tokenizer_config.json`).

Special-token semantics follow llama.cpp: with `parse_special=False`, control tokens typed in
the text (`<|im_end|>`) are plain characters, while user-defined tokens still match; control
tokens have no output bytes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

# llama.cpp's pre-tokenizer regexes per `tokenizer.ggml.pre` (src/llama-vocab.cpp). Each list
# is applied in turn, every regex splitting the pieces of the previous one.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_REGEXES: dict[str, list[str]] = {
    "gpt-2": [_GPT2],
    "gpt2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "starcoder": [r"\p{N}", _GPT2],
    "refact": [r"\p{N}", _GPT2],
    "codeshell": [r"\p{N}", _GPT2],
    "llama3": [_LLAMA3],
    "llama-v3": [_LLAMA3],
    "llama-bpe": [_LLAMA3],
    "qwen2": [_QWEN2],
    "deepseek-r1-qwen": [_QWEN2],
}
# llama.cpp's pre types whose BPE looks a whole word up before merging (`ignore_merges`).
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe"}
# Texts llama.cpp also treats as end-of-generation (and as control tokens) when they are in
# the vocabulary (src/llama-vocab.cpp, llama_vocab::impl::load: "special_eog_ids"). FIM
# pad/repo/file-separator tokens count too, one of each (the first in sorted text order).
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
              "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
              "<|end_of_text|>", "<end_of_utterance>"}
_FIM_EOG_TEXTS = (
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
# GGUF token types (gguf.TokenType)
_CONTROL, _USER_DEFINED = 3, 4


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> byte (`bytes_to_unicode`)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in keep}
    n = 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + n)] = b
            n += 1
    return table


class MLXTokenizer:
    """Implements `backends.base.Tokenizer` over a `tokenizers.Tokenizer`.

    Args:
        tok: the tokenizer; special tokens already registered as added tokens.
        pieces: per-id token text as stored in the vocabulary (byte-level or `▁` form).
        control_ids: ids without output bytes (llama.cpp CONTROL tokens / HF special tokens).
        byte_level: pieces use GPT-2's byte-level alphabet (else SentencePiece `▁`/`<0xNN>`).
    """

    def __init__(self, tok, pieces: list[str], control_ids: set[int], byte_level: bool,
                 bos_id: int | None, eos_ids: set[int], add_bos: bool, add_eos: bool,
                 chat_template: str | None):
        from tokenizers import Tokenizer

        self._tok = tok
        # A second instance encodes control tokens as text; toggling one shared instance per
        # call would race between threads.
        self._tok_plain = Tokenizer.from_str(tok.to_str())
        self._tok_plain.encode_special_tokens = True
        self._pieces = pieces
        self._control = control_ids
        self._byte_level = byte_level
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.chat_template = chat_template
        self._bytes_cache: dict[int, bytes] = {}

    @property
    def n_vocab(self) -> int:
        return len(self._pieces)

    def encode(self, text: str, add_special: bool = False,
               parse_special: bool = False) -> list[int]:
        tok = self._tok if parse_special else self._tok_plain
        ids = tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        if add_special and self.add_eos and self.eos_ids:
            ids = [*ids, min(self.eos_ids)]
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        b = self._bytes_cache.get(token_id)
        if b is None:
            b = self._piece_bytes(token_id)
            self._bytes_cache[token_id] = b
        return b

    def _piece_bytes(self, token_id: int) -> bytes:
        if token_id in self._control or not 0 <= token_id < len(self._pieces):
            return b""
        piece = self._pieces[token_id]
        if self._byte_level:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
            return piece.encode("utf-8")  # added tokens are stored as plain text
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """Text of one token including control tokens' markup (e.g. `<|im_end|>`)."""
        if token_id in self._control and 0 <= token_id < len(self._pieces):
            return self._pieces[token_id]
        return self.token_bytes(token_id).decode("utf-8", "replace")

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", "replace")

    def to_hf_json(self) -> str:
        """The `tokenizer.json` text (for `models convert`)."""
        return self._tok.to_str()

    def specials(self) -> dict[str, Any]:
        """Metadata that `tokenizer.json` does not carry (saved next to it by convert)."""
        return {"bos_id": self.bos_id, "eos_ids": sorted(self.eos_ids),
                "control_ids": sorted(self._control), "byte_level": self._byte_level,
                "add_bos": self.add_bos, "add_eos": self.add_eos,
                "chat_template": self.chat_template}


def _eog_by_text(vocab: dict[str, int]) -> set[int]:
    """End-of-generation ids llama.cpp infers from token texts."""
    ids = {vocab[t] for t in _EOG_TEXTS if t in vocab}
    for texts in _FIM_EOG_TEXTS:
        found = sorted(t for t in texts if t in vocab)
        if found:
            ids.add(vocab[found[0]])
    return ids


def tokenizer_from_gguf(reader) -> MLXTokenizer:
    """Rebuild a GGUF's byte-level BPE tokenizer. Raises ValueError for tokenizer models or
    pre-tokenizers we cannot reproduce exactly (SentencePiece "llama" vocabularies, unknown
    `pre` names)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from backends.mlx.gguf_weights import field

    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported by the MLX backend "
                         "(only byte-level BPE 'gpt2'); use --backend llamacpp")
    pre = str(field(reader, "tokenizer.ggml.pre", "default"))
    if pre not in _PRE_REGEXES:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not known to the MLX backend "
                         f"(known: {', '.join(sorted(_PRE_REGEXES))}); use --backend llamacpp")
    pieces: list[str] = list(field(reader, "tokenizer.ggml.tokens"))
    types = list(field(reader, "tokenizer.ggml.token_type", [1] * len(pieces)))
    vocab = {p: i for i, p in enumerate(pieces)}
    eog = _eog_by_text(vocab)
    for i in eog:  # llama.cpp overrides these to CONTROL
        types[i] = _CONTROL
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges", [])]
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _IGNORE_MERGES)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_REGEXES[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    control = {i for i, t in enumerate(types) if t == _CONTROL}
    tok.add_tokens([AddedToken(pieces[i], special=(t == _CONTROL), normalized=False)
                    for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)])

    def special_id(name):
        v = field(reader, f"tokenizer.ggml.{name}_token_id")
        return None if v is None else int(v)

    eos_ids = eog | {i for i in (special_id("eos"), special_id("eot"), special_id("eom"))
                     if i is not None}
    return MLXTokenizer(
        tok, pieces, control, byte_level=True, bos_id=special_id("bos"), eos_ids=eos_ids,
        add_bos=bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
        chat_template=field(reader, "tokenizer.chat_template"))


def tokenizer_from_dir(path: str | Path) -> MLXTokenizer:
    """Load `tokenizer.json` (+ `tandem_tokenizer.json` written by convert, or
    `tokenizer_config.json` / `chat_template.jinja` of a Hugging Face repo).
    Raises FileNotFoundError without a `tokenizer.json`."""
    from tokenizers import Tokenizer

    path = Path(path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    pieces = [""] * (max(vocab.values()) + 1)
    for p, i in vocab.items():
        pieces[i] = p
    spec_file = path / "tandem_tokenizer.json"
    if spec_file.exists():
        s = json.loads(spec_file.read_text())
        return MLXTokenizer(tok, pieces, set(s["control_ids"]), s["byte_level"], s["bos_id"],
                            set(s["eos_ids"]), s["add_bos"], s["add_eos"], s["chat_template"])
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    control = {int(i) for i, t in cfg.get("added_tokens_decoder", {}).items()
               if t.get("special")}
    control |= {i for i, t in tok.get_added_tokens_decoder().items() if t.special}

    def tid(name):
        t = cfg.get(name)
        if isinstance(t, dict):
            t = t.get("content")
        return vocab.get(t) if t else None

    eos_ids = {i for i in (tid("eos_token"),) if i is not None}
    eos_ids |= {i for i in control if pieces[i] in _EOG_TEXTS}
    gen_cfg = path / "generation_config.json"
    if gen_cfg.exists():
        e = json.loads(gen_cfg.read_text()).get("eos_token_id")
        eos_ids |= set(e if isinstance(e, list) else [e] if e is not None else [])
    template = cfg.get("chat_template")
    if (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    byte_level = "ByteLevel" in json.dumps(json.loads(tok.to_str()).get("decoder"))
    return MLXTokenizer(tok, pieces, control, byte_level, tid("bos_token"), eos_ids,
                        add_bos=bool(cfg.get("add_bos_token", False)),
                        add_eos=bool(cfg.get("add_eos_token", False)), chat_template=template)
