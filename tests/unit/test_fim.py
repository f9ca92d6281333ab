"""Fill-in-the-middle prompts (`app.server.fim`) on tokenizers with and without FIM tokens,
and the Ollama options translation (`app.server.ollama_schemas.sampling_options`)."""

from __future__ import annotations

import pytest

from app.server.errors import APIError
from app.server.fim import fim_ids, fim_prompt_ids, supports_fim
from app.server.ollama_schemas import sampling_options
from tests.fakes.tokenizer import FakeTokenizer


class FimTokenizer(FakeTokenizer):
    """Byte tokens plus special tokens for the given spellings (ids from 300 up)."""

    def __init__(self, spellings: tuple[str, ...], **kw: object):
        super().__init__("bytes", **kw)  # type: ignore[arg-type]
        for i, text in enumerate(spellings):
            self._markup[300 + i] = text
        import re

        self._special_re = re.compile("(" + "|".join(map(re.escape, self._markup.values()))
                                      + ")")
        self.n_vocab = 300 + len(spellings)


QWEN = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def test_prompt_is_prefix_suffix_middle() -> None:
    tok = FimTokenizer(QWEN, bos_id=None)
    ids = fim_prompt_ids(tok, "def f(", "    return x")
    assert ids == [300, *b"def f(", 301, *b"    return x", 302]
    assert supports_fim(tok) and fim_ids(tok) == {"prefix": 300, "suffix": 301, "middle": 302}


def test_bos_first_when_the_model_adds_one() -> None:
    tok = FimTokenizer(QWEN, bos_id=256)  # FakeTokenizer adds its BOS with add_special
    assert fim_prompt_ids(tok, "a", "b") == [256, 300, ord("a"), 301, ord("b"), 302]


def test_markup_in_the_code_stays_text() -> None:
    tok = FimTokenizer(QWEN, bos_id=None)
    ids = fim_prompt_ids(tok, "<|fim_middle|>", "")
    assert ids == [300, *b"<|fim_middle|>", 301, 302]


def test_other_families_spellings() -> None:
    starcoder = FimTokenizer(("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), bos_id=None)
    assert fim_prompt_ids(starcoder, "x", "y") == [300, ord("x"), 301, ord("y"), 302]
    codellama = FimTokenizer(("<PRE>", "<SUF>", "<MID>"), bos_id=None)
    assert supports_fim(codellama)


def test_tokenizer_ids_win() -> None:
    tok = FakeTokenizer("bytes", bos_id=None)
    tok.fim_ids = {"prefix": 1, "suffix": 2, "middle": 3}  # type: ignore[attr-defined]
    assert fim_prompt_ids(tok, "a", "b") == [1, ord("a"), 2, ord("b"), 3]


def test_missing_tokens_are_named() -> None:
    partial = FimTokenizer(("<|fim_prefix|>", "<|fim_suffix|>"), bos_id=None)
    with pytest.raises(APIError) as info:
        fim_prompt_ids(partial, "a", "b")
    assert (info.value.status, info.value.param) == (400, "suffix")
    assert info.value.message == (
        "This model has no fill-in-the-middle tokens (missing: middle; e.g. "
        "<|fim_middle|>), so 'suffix' (insertion) cannot be served.")
    assert not supports_fim(FakeTokenizer())


def test_ollama_options() -> None:
    fields, limit = sampling_options({"temperature": 0, "top_k": 40.0, "seed": -1,
                                      "stop": "\n", "num_ctx": 1 << 20, "num_thread": 8,
                                      "repeat_penalty": 1.1, "num_predict": -1,
                                      "unknown_option": 1})
    assert (fields.temperature, fields.top_k, fields.seed, fields.stop_list()) == (
        0.0, 40, None, ["\n"])
    assert (fields.repetition_penalty, limit) == (1.1, None)
    assert sampling_options({"num_predict": 7, "seed": 3})[0].seed == 3
    assert sampling_options({"num_predict": 7})[1] == 7
    for bad in ({"temperature": True}, {"temperature": float("nan")}, {"typical_p": 0.5},
                {"num_predict": -3}):
        with pytest.raises(APIError):
            sampling_options(bad)
