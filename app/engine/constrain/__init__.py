"""Constrained decoding: grammars (JSON schemas) that the output must match, enforced by
masking logits inside the batched step. One grammar engine, llguidance (MIT; Microsoft
guidance-ai), for every backend. No HTTP here: the server maps `GrammarError` to a 400.

- `vocab`: the grammar engine's view of a model's vocabulary, built once per loaded model;
- `grammar`: `GrammarCompiler` (per model: validates and compiles response formats, caches
  compiled grammars by (kind, schema text)) and `CompiledGrammar`;
- `matcher`: `Matcher`, one per constrained sequence (consume, roll back, forced tokens);
- `mask`: token bitmasks for a batch of logits rows, and their vectorised application.
"""

from app.engine.constrain.grammar import (
    JSON_SEPARATORS,
    CompiledGrammar,
    GrammarCompiler,
    GrammarError,
    ResponseFormat,
)
from app.engine.constrain.matcher import Matcher

__all__ = [
    "JSON_SEPARATORS",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "Matcher",
    "ResponseFormat",
]
