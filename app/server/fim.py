"""Fill-in-the-middle (FIM): the prompt that asks a code model for the text between a prefix
and a suffix, for `/v1/completions` with `suffix` and Ollama's `/api/generate` with `suffix`.

The model's FIM tokens come from its tokenizer: llama.cpp's vocabulary (`fim_ids`, read from
the GGUF metadata `tokenizer.ggml.fim_{pre,suf,mid}_token_id` or found by llama.cpp among the
known spellings), else the spellings below looked up in the vocabulary (any tokenizer: a
spelling counts when it encodes, special tokens parsed, to one token whose text it is). The
spellings are those llama.cpp recognises (`src/llama-vocab.cpp`, "find FIM_PRE token").

The prompt is prefix-suffix-middle, as llama-server's `/infill` orders it
(`tools/server/server-common.cpp`, `format_prompt_infill`, `spm_infill` off) and as
Ollama's templates for Qwen2.5-Coder, StarCoder and CodeLlama write it:
`[BOS if the model adds one] FIM_PRE prefix FIM_SUF suffix FIM_MID`; the model then writes
the middle and ends it with an end-of-generation token (Qwen's `<|endoftext|>`). Prefix and
suffix are tokenized as plain text (special-token markup in code is not parsed), as
llama-server does; the repository-level extras of `/infill` (`input_extra`) are not built.
"""

from __future__ import annotations

from typing import Any

from app.server.errors import bad_request

PARTS = ("prefix", "suffix", "middle")
SPELLINGS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
               "▁<PRE>", "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
               "▁<SUF>", "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
               "▁<MID>", "<|code_middle|>"),
}


def _lookup(tokenizer: Any, spellings: tuple[str, ...]) -> int | None:
    for text in spellings:
        try:
            ids = tokenizer.encode(text, add_special=False, parse_special=True)
        except (ValueError, UnicodeError):
            continue
        if len(ids) == 1 and tokenizer.token_text(ids[0]) == text:
            return ids[0]
    return None


def fim_ids(tokenizer: Any) -> dict[str, int]:
    """The model's FIM tokens found, `{"prefix"|"suffix"|"middle": token id}` (cached on the
    tokenizer object when it allows it)."""
    known = getattr(tokenizer, "fim_ids", None)
    if isinstance(known, dict):
        return known
    cached = getattr(tokenizer, "_tandem_fim_ids", None)
    if cached is not None:
        return cached
    found = {}
    for part in PARTS:
        token = _lookup(tokenizer, SPELLINGS[part])
        if token is not None:
            found[part] = token
    try:
        tokenizer._tandem_fim_ids = found
    except AttributeError:  # slotted tokenizers: look up again next time
        pass
    return found


def supports_fim(tokenizer: Any) -> bool:
    """Whether the model has all three FIM tokens."""
    return len(fim_ids(tokenizer)) == len(PARTS)


def fim_prompt_ids(tokenizer: Any, prefix: str, suffix: str, param: str = "suffix") -> list[int]:
    """Token ids of the FIM prompt for `prefix` and `suffix` (see the module docstring).

    Raises APIError 400 (`param`) naming the FIM tokens the model lacks, e.g. "This model
    has no fill-in-the-middle tokens (missing: prefix, suffix, middle), so 'suffix' cannot
    be served."."""
    ids = fim_ids(tokenizer)
    missing = [p for p in PARTS if p not in ids]
    if missing:
        raise bad_request(
            f"This model has no fill-in-the-middle tokens (missing: {', '.join(missing)}; "
            f"e.g. {', '.join(SPELLINGS[p][0] for p in missing)}), so '{param}' (insertion) "
            "cannot be served.", param=param)
    out = list(tokenizer.encode("", add_special=True))  # [BOS] when the model adds one
    out.append(ids["prefix"])
    out += tokenizer.encode(prefix, add_special=False, parse_special=False)
    out.append(ids["suffix"])
    out += tokenizer.encode(suffix, add_special=False, parse_special=False)
    out.append(ids["middle"])
    return out
