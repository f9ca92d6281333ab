"""Response formats compiled to grammars, per model, with a cache.

`GrammarCompiler.compile(ResponseFormat)` checks a JSON schema against its meta-schema
(`jsonschema`), turns it into an llguidance grammar with bounded whitespace, and builds a
matcher for this model's vocabulary, under parser limits and a wall-clock timeout. A
`CompiledGrammar` is shared (one per distinct schema and model) and hands out one fresh
`Matcher` per sequence.

Whitespace: outside strings the output is exactly what `json.dumps` writes with
`JSON_SEPARATORS` (", " and ": ", the separators Hugging Face chat templates' `tojson` uses,
so models have seen them) and nothing else: no newlines, no indentation, no runs of spaces
(llguidance's flexible whitespace would let a small model run to `max_tokens` on spaces).
A schema's own `x-guidance` options cannot turn this off.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import jsonschema
import llguidance

from app.engine.constrain.matcher import Matcher
from app.engine.constrain.vocab import STRING_SLICES, grammar_tokenizer
from backends.base import Tokenizer

JSON_SEPARATORS = (", ", ": ")  # (item, key): json.dumps' defaults
_JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": JSON_SEPARATORS[0],
    "key_separator": JSON_SEPARATORS[1],
}
# `json_object`: any JSON object (OpenAI's JSON mode)
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}

# A grammar that takes longer than this to build is refused (400), never waited for.
COMPILE_TIMEOUT_S = 5.0
# llguidance's limits, lower than its defaults where a request could make the grammar
# engine work for seconds: lexer fuel ~50k/ms to build, ~14k/ms per mask step.
PARSER_LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
                     max_grammar_size=200_000, verbose_errors=False)
CACHE_SIZE = 256  # compiled grammars kept per model (least recently used dropped)


class GrammarError(ValueError):
    """A response format that cannot be enforced. `reason` says why (for the client);
    `code` is a stable identifier: `invalid_json_schema` (fails the meta-schema or the
    grammar engine refuses it) or `grammar_too_complex` (limits or timeout)."""

    def __init__(self, reason: str, code: str = "invalid_json_schema"):
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """What the output must be: `kind` "json_object" (any JSON object) or "json_schema"
    (valid against `schema`, a JSON Schema as a dict). `name` labels it in errors."""

    kind: str
    schema: dict[str, Any] | None = None
    name: str | None = None

    def schema_text(self) -> str:
        """The schema as canonical JSON text (the cache key)."""
        schema = JSON_OBJECT_SCHEMA if self.kind == "json_object" else self.schema
        return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class CompiledGrammar:
    """A grammar built for one model's vocabulary. Thread-safe: `matcher()` copies a
    template matcher that is never advanced. `compile_s` is how long building it took."""

    def __init__(self, template: llguidance.LLMatcher, fmt: ResponseFormat, compile_s: float):
        self._template = template
        self._lock = threading.Lock()  # an LLMatcher is used by one thread at a time
        self.format = fmt
        self.compile_s = compile_s

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the grammar, for one sequence."""
        with self._lock:
            return Matcher(self._template.deep_copy())


class GrammarCompiler:
    """Compiles response formats for one loaded model; thread-safe.

    Args:
        tokenizer: the runner's tokenizer.
        n_logits: the logits width (the runner's `info.n_vocab`): every mask covers it.
        timeout_s: the most seconds one grammar may take to build.
        slices: the vocabulary view's slicer regexes (`vocab.STRING_SLICES`; None:
            llguidance's defaults). They change how fast masks are filled, never a mask.
    The vocabulary view (`vocab.grammar_tokenizer`) is built on the first compile (about
    0.3 s per 50k tokens with the slices: README, "Structured outputs"), then kept.
    """

    def __init__(self, tokenizer: Tokenizer, n_logits: int,
                 timeout_s: float = COMPILE_TIMEOUT_S,
                 slices: Sequence[str] | None = STRING_SLICES):
        self.tokenizer = tokenizer
        self.n_logits = n_logits
        self.timeout_s = timeout_s
        self.slices = slices
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self.compiled = 0  # grammars built (cache misses that succeeded)
        self.cache_hits = 0

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = grammar_tokenizer(self.tokenizer, self.n_logits,
                                                        slices=self.slices)
            return self._lltokenizer

    def compile(self, fmt: ResponseFormat) -> CompiledGrammar:
        """The grammar of `fmt`, from the cache or built now (blocking; call it off the
        event loop). Raises GrammarError: the schema fails its meta-schema, uses what the
        grammar engine does not support, exceeds the parser limits, or takes longer than
        `timeout_s` to build (the build then finishes in the background, bounded by the
        limits, and is not cached)."""
        if fmt.kind not in ("json_object", "json_schema"):
            raise ValueError(f"response format kind {fmt.kind!r} has no grammar")
        key = fmt.kind + ":" + fmt.schema_text()
        if (hit := self._cached(key)) is not None:
            return hit
        schema = JSON_OBJECT_SCHEMA if fmt.kind == "json_object" else fmt.schema
        check_schema(schema)
        return self._build_cached(key, fmt, _build, schema)

    def compile_lark(self, text: str, label: str = "grammar") -> CompiledGrammar:
        """A grammar in llguidance's Lark dialect (e.g. tool calls: `%json` schemas between
        literal markers), from the cache or built now (blocking). `label` names it in
        `CompiledGrammar.format`. Raises GrammarError as `compile`."""
        key = "lark:" + text
        if (hit := self._cached(key)) is not None:
            return hit
        return self._build_cached(key, ResponseFormat("lark", name=label), _build_lark, text)

    def _cached(self, key: str) -> CompiledGrammar | None:
        """The cached grammar of `key` (now the most recently used), or None."""
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
            return hit

    def _build_cached(self, key: str, fmt: ResponseFormat, build: Any,
                      source: Any) -> CompiledGrammar:
        lltok = self.lltokenizer
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(2, thread_name_prefix="tandem-grammar")
            pool = self._pool
        future = pool.submit(build, lltok, source)
        try:
            template, seconds = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise GrammarError(f"the grammar took longer than {self.timeout_s:g} s to build; "
                               "simplify the schema", "grammar_too_complex") from None
        compiled = CompiledGrammar(template, fmt, seconds)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            self.compiled += 1
        return compiled


def check_schema(schema: Any) -> None:
    """Raise GrammarError unless `schema` is a JSON object valid against its meta-schema
    (the draft its `$schema` names, else 2020-12)."""
    if not isinstance(schema, dict):
        raise GrammarError("the schema must be a JSON object")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.absolute_path)
        at = f" at schema{where}" if where else ""
        raise GrammarError(f"the schema is not a valid JSON Schema{at}: {exc.message}") from None


def _build(lltok: llguidance.LLTokenizer,
           schema: dict[str, Any]) -> tuple[llguidance.LLMatcher, float]:
    """Build the template matcher of a JSON schema (llguidance releases the GIL
    meanwhile). Raises GrammarError with llguidance's reason."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except ValueError as exc:
        raise GrammarError(f"the schema cannot be compiled: {exc}") from None
    return _matcher(lltok, grammar, "the schema")


def _build_lark(lltok: llguidance.LLTokenizer, text: str) -> tuple[llguidance.LLMatcher, float]:
    """Build the template matcher of a Lark grammar. Raises GrammarError."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_lark(text)
    except ValueError as exc:
        raise GrammarError(f"the grammar cannot be compiled: {exc}") from None
    return _matcher(lltok, grammar, "the grammar")


def _matcher(lltok: llguidance.LLTokenizer, grammar: str,
             what: str) -> tuple[llguidance.LLMatcher, float]:
    import time

    t0 = time.perf_counter()
    limits = llguidance.LLParserLimits(**PARSER_LIMITS)
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0, limits=limits)
    if matcher.is_error():
        reason = matcher.get_error()
        code = "grammar_too_complex" if _is_limit(reason) else "invalid_json_schema"
        raise GrammarError(f"{what} is not supported: {reason}", code)
    return matcher, time.perf_counter() - t0


def _is_limit(reason: str) -> bool:
    low = reason.lower()
    return any(w in low for w in ("fuel", "limit", "too large", "too complex", "too many"))
