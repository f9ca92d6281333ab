"""The GGUF-built tokenizer of the MLX backend gives llama.cpp's token ids."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine; we've done it, you'd agree.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "    indented\twith\ttabs\r\nand CRLF  ",
    "  leading and trailing spaces   ",
    "\n\n\nmany\n\n newlines \n",
    "numbers: 1234567890 3.14159 -42 1e-9 ١٢٣",
    "emoji 🤖👍🏽👨‍👩‍👧‍👦 and flags 🇫🇷",
    "中文分词测试，日本語のテキスト、한국어 문장",
    "Ünïcödé àccents, ß, Ω, Ж, ñ",
    "<|im_start|>user\nhi<|im_end|>",
    "a<|endoftext|>b <reponame> c",
    "",
    " ",
    "x" * 40 + " " + "ab" * 20,
]


@pytest.fixture(scope="module")
def tok(gguf_path):
    from backends.mlx.gguf_weights import open_gguf
    from backends.mlx.tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(open_gguf(gguf_path))


@pytest.mark.parametrize("parse_special", [False, True])
def test_ids_match_llamacpp(tok, llama_ref, parse_special):
    mismatches = []
    for text in CORPUS:
        ours = tok.encode(text, add_special=True, parse_special=parse_special)
        theirs = llama_ref.tokenize(text, add_special=True, parse_special=parse_special)
        if ours != theirs:
            mismatches.append((text, ours, theirs))
    assert not mismatches


def test_round_trip(tok):
    for text in CORPUS:
        assert tok.decode(tok.encode(text)) == text


def test_special_tokens_are_text_unless_parsed(tok):
    assert tok.encode("<|im_end|>", parse_special=True) == [2]
    assert 2 not in tok.encode("<|im_end|>", parse_special=False)
    assert tok.token_bytes(2) == b""  # control tokens have no output text


def test_eog_matches_llamacpp(tok, llama_ref):
    theirs = {i for i in range(llama_ref.n_vocab) if llama_ref.is_eog(i)}
    assert tok.eos_ids == theirs


def test_split_character_bytes(tok):
    ids = tok.encode("🤖")
    assert b"".join(tok.token_bytes(i) for i in ids) == "🤖".encode()
