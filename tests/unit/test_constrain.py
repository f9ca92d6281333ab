"""`app.engine.constrain` without a model: the vocabulary view, compiling and caching
response formats, failing closed, masks (every draft position), apply, rollback."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.engine.constrain import GrammarCompiler, GrammarError, ResponseFormat, vocab
from app.engine.constrain import grammar as grammar_module
from app.engine.constrain.mask import (
    MaskRequest,
    allowed,
    apply_masks,
    apply_unpacked,
    fill_masks,
    words,
)
from app.engine.constrain.vocab import STRING_SLICES, grammar_tokenizer, vocabulary_bytes
from tests.fakes.tokenizer import FakeTokenizer

EOS = 257  # FakeTokenizer("bytes"): ids 0-255 are bytes, BOS 256, EOS 257
PERSON = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def schema_format(schema) -> ResponseFormat:
    return ResponseFormat("json_schema", schema, "test")


@pytest.fixture
def compiler() -> GrammarCompiler:
    return GrammarCompiler(FakeTokenizer(), 300)  # logits wider than the 258 tokens


def allowed_bytes(bitmask: np.ndarray, row: int) -> bytes:
    ok = allowed(bitmask, 300)[row]
    return bytes(np.flatnonzero(ok[:256]).astype(np.uint8))


def test_vocabulary_view_pads_to_the_logits_width_and_marks_control_tokens():
    tokens, special = vocabulary_bytes(FakeTokenizer(), 300)
    assert len(tokens) == 300
    assert tokens[65] == b"A"
    assert tokens[256] == b"\xff<s>" and tokens[257] == b"\xff</s>"
    assert tokens[258:] == [b""] * 42
    assert special == [256, 257]
    lltok = grammar_tokenizer(FakeTokenizer(), 300)
    assert lltok.vocab_size == 300
    assert lltok.eos_tokens == [EOS]


def test_the_vocabulary_view_gets_tandems_slices_unless_told_otherwise(monkeypatch):
    built = []
    real = vocab.llguidance.LLTokenizer

    def spy(*args, **kwargs):
        built.append(kwargs.get("slices"))
        return real(*args, **kwargs)

    monkeypatch.setattr(vocab.llguidance, "LLTokenizer", spy)
    assert GrammarCompiler(FakeTokenizer(), 300).lltokenizer.vocab_size == 300
    assert GrammarCompiler(FakeTokenizer(), 300, slices=None).lltokenizer.vocab_size == 300
    assert built == [list(STRING_SLICES), None]
    assert STRING_SLICES[1] == r'[^"\\\x00-\x1F\x7F]{1,2}'
    # llguidance's own slices are all kept (a change of its defaults shows here)
    assert set(real.general_slices()) <= set(STRING_SLICES)


def test_a_tokenizer_without_eos_is_refused():
    with pytest.raises(ValueError, match="end-of-sequence"):
        grammar_tokenizer(FakeTokenizer(eos_id=None), 300)


def test_compiled_grammars_are_cached_by_schema_text(compiler):
    g1 = compiler.compile(schema_format(PERSON))
    reordered = dict(reversed(list(PERSON.items())))
    g2 = compiler.compile(schema_format(reordered))
    assert g2 is g1
    assert (compiler.compiled, compiler.cache_hits) == (1, 1)
    assert compiler.compile(ResponseFormat("json_object")) is not g1
    assert compiler.compiled == 2


@pytest.mark.parametrize("schema, code, reason", [
    ({"type": "objekt"}, "invalid_json_schema",
     "the schema is not a valid JSON Schema at schema['type']: 'objekt' is not valid under "
     "any of the given schemas"),
    ({"type": "object", "properties": {"a": {"minLength": "3"}}}, "invalid_json_schema",
     "the schema is not a valid JSON Schema at schema['properties']['a']['minLength']: "
     "'3' is not of type 'integer'"),
    ({"not": {"type": "string"}}, "invalid_json_schema",
     'the schema is not supported: Unimplemented keys: ["not"]'),
    ({"$ref": "#/$defs/missing"}, "invalid_json_schema",
     "the schema is not supported: Pointer '/$defs/missing' does not exist"),
    ({"type": "string", "format": "colour"}, "invalid_json_schema",
     "the schema is not supported: Unknown format: colour"),
    ([1, 2], "invalid_json_schema", "the schema must be a JSON object"),
])
def test_schemas_that_cannot_be_enforced_fail_closed(compiler, schema, code, reason):
    with pytest.raises(GrammarError) as info:
        compiler.compile(schema_format(schema))
    assert (info.value.code, info.value.reason) == (code, reason)
    assert compiler.compiled == 0


def test_a_grammar_that_builds_too_long_is_refused_and_not_cached(compiler, monkeypatch):
    real = grammar_module._build

    def slow(lltok, schema):
        time.sleep(0.5)
        return real(lltok, schema)

    monkeypatch.setattr(grammar_module, "_build", slow)
    compiler.timeout_s = 0.05
    t0 = time.perf_counter()
    with pytest.raises(GrammarError) as info:
        compiler.compile(schema_format(PERSON))
    assert time.perf_counter() - t0 < 0.4
    assert info.value.code == "grammar_too_complex"
    assert info.value.reason == ("the grammar took longer than 0.05 s to build; simplify "
                                 "the schema")
    assert compiler.compiled == 0


def test_mask_rows_follow_the_drafts_and_leave_the_matcher_where_it_was(compiler):
    grammar = compiler.compile(schema_format(PERSON))
    m, other = grammar.matcher(), grammar.matcher()
    for b in b'{"a": 1':
        assert m.consume(b)
    before = fill_masks([MaskRequest(m, 0, [])], 1, 300)
    # drafts '2, "b' then an invalid 'q': rows after the invalid draft are not masked
    bitmask = fill_masks([MaskRequest(m, 0, list(b'2, "bq!')), MaskRequest(other, 8, [])],
                         9, 300)
    assert bitmask.shape == (9, words(300)) == (9, 10)
    rows = [allowed_bytes(bitmask, r) for r in range(9)]
    assert rows[:6] == [b",0123456789", b",0123456789", b" ", b'"', b"b", b'"']
    assert rows[7] == bytes(range(256))  # after the refused 'q': never reached, all allowed
    assert rows[8] == b"{"  # the other sequence, at its start
    assert m.consumed == 7
    np.testing.assert_array_equal(fill_masks([MaskRequest(m, 0, [])], 1, 300), before)


def test_valid_prefix_and_forced_tokens(compiler):
    m = compiler.compile(schema_format(PERSON)).matcher()
    assert bytes(m.forced_tokens()) == b'{"a": '
    assert m.valid_prefix(list(b'{"a": 12, "b": "q"}')) == len(b'{"a": 12, "b": "')
    assert m.consumed == 0


def test_rollback_restores_the_state(compiler):
    m = compiler.compile(schema_format(PERSON)).matcher()
    for b in b'{"a": 12, "b": "y"}':
        assert m.consume(b)
    assert m.stopped and m.accepting
    assert allowed(fill_masks([MaskRequest(m, 0, [])], 1, 300), 300)[0].nonzero()[0].tolist() \
        == [EOS]
    m.rollback(3)
    assert not m.stopped and m.consumed == len(b'{"a": 12, "b": "')
    assert allowed_bytes(fill_masks([MaskRequest(m, 0, [])], 1, 300), 0) == b"xy"
    with pytest.raises(ValueError, match="cannot roll back 99 tokens"):
        m.rollback(99)


def test_apply_masks_sets_forbidden_logits_to_minus_inf_only_in_constrained_rows(compiler):
    m = compiler.compile(schema_format(PERSON)).matcher()
    bitmask = fill_masks([MaskRequest(m, 1, [])], 2, 300)
    logits = np.arange(2 * 320, dtype=np.float32).reshape(2, 320)  # wider than the mask
    view = logits.copy()
    view.flags.writeable = False  # a backend's read-only buffer
    out = apply_masks(view, bitmask, [1], [EOS])
    np.testing.assert_array_equal(out[0], logits[0])
    assert np.flatnonzero(np.isfinite(out[1])).tolist() == [ord("{")]
    assert out[1, ord("{")] == logits[1, ord("{")]
    np.testing.assert_array_equal(view, logits)  # the read-only buffer was copied
    # a writable array is masked in place: no copy of its rows
    writable = logits.copy()
    assert apply_masks(writable, bitmask, [1], [EOS]) is writable
    np.testing.assert_array_equal(writable, out)


def test_a_row_that_allows_nothing_falls_back_to_eos():
    bitmask = np.zeros((1, words(300)), dtype=np.int32)
    out = apply_masks(np.zeros((1, 300), np.float32), bitmask, [0], [EOS])
    assert np.flatnonzero(np.isfinite(out[0])).tolist() == [EOS]


@pytest.mark.parametrize("width", [4000, 3990, 4030])  # the mask's width, narrower, wider
def test_apply_masks_equals_unpacking_every_row_at_every_density(width):
    """Rows that allow a few words' tokens and rows with more (the two paths of
    `apply_masks`), all-zero rows (the EOS fallback) and all-one rows give exactly what
    unpacking every row gives."""
    rng = np.random.default_rng(7)
    n_words = words(4000)
    masks = []
    for density in (0.0, 0.02, 0.1, 0.5, 0.9, 0.98, 1.0):
        for _ in range(3):
            row = np.zeros(n_words, dtype=np.int32)
            chosen = rng.random(n_words) < density  # words with some bits set
            row[chosen] = rng.integers(-2**31, 2**31, size=int(chosen.sum()), dtype=np.int64)
            full = rng.random(n_words) < density  # and words with all bits set
            row[full] = -1
            masks.append(row)
    bitmask = np.stack(masks)
    logits = rng.standard_normal((len(masks) + 1, width)).astype(np.float32)
    rows = list(range(1, len(masks) + 1))
    shifted = np.vstack([np.zeros((1, n_words), np.int32), bitmask])
    expected = apply_unpacked(logits.copy(), shifted, rows, [EOS, 5])
    got = apply_masks(logits.copy(), shifted, rows, [EOS, 5])
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got[0], logits[0])  # an unconstrained row is untouched
    assert np.flatnonzero(np.isfinite(got[1])).tolist() == [5, EOS]  # all-zero: fallback
    kinds = [np.isfinite(got[r]).mean() for r in rows]
    assert min(kinds) < 0.05 and max(kinds) > 0.95  # both paths were taken


def test_whitespace_is_bounded_to_the_json_dumps_separators(compiler):
    m = compiler.compile(ResponseFormat("json_object")).matcher()
    assert allowed_bytes(fill_masks([MaskRequest(m, 0, [])], 1, 300), 0) == b"{"
    assert m.consume(ord("{"))
    assert allowed_bytes(fill_masks([MaskRequest(m, 0, [])], 1, 300), 0) == b'"}'
    for b in b'"k":':
        assert m.consume(b)
    assert allowed_bytes(fill_masks([MaskRequest(m, 0, [])], 1, 300), 0) == b" "
