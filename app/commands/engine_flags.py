"""The engine flags of `run`, `chat`, `serve` and `bench`, mapped onto `EngineArgs` in one
place: each flag names the field it sets, and its default and help come from there, so the
commands cannot drift apart."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.config import EngineArgs
from backends.base import AUTO_ON_OFF, KV_CACHE_TYPES


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            shown = text if value is None else value
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {shown!r}"
                if minimum != 1 else f"expected a positive integer, got {shown!r}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag: `field` is a dotted path into `EngineArgs`."""

    name: str
    field: str
    help: str
    type: Callable[[str], Any] | None = str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    short: str | None = None
    action: str | None = None  # e.g. "store_true" for a switch

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


MODEL = Flag("--model", "model", "registry name, path to a .gguf file, or an MLX model "
             "directory", short="-m", metavar="NAME_OR_PATH")
BACKEND = Flag("--backend", "backend", "model runner; automatic when unset (see `tandem "
               "doctor`)", choices=("llamacpp", "mlx"))
CTX_SIZE = Flag("--ctx-size", "runner.seq_tokens", "context window per sequence, tokens "
                "(capped by the model's)", positive_int, metavar="TOKENS")
THREADS = Flag("--threads", "runner.n_threads", "CPU threads of the backend (unset: all "
               "available CPUs)", positive_int, metavar="N")
KV_LAYOUT = Flag("--kv-layout", "runner.kv_layout", "llama.cpp KV cache: split (a stream "
                 "per sequence, concurrency x ctx-size cells allocated up front; greedy and "
                 "seeded output independent of load), auto (split with as many sequences as "
                 "1/8 of this machine's memory holds) or unified (one shared pool: more "
                 "sequences in less memory, but output may vary with load)",
                 choices=("auto", "split", "unified"))
REPACK = Flag("--repack", "runner.repack", "llama.cpp repacked weights (its extra CPU "
              "buffer types, faster decode): auto (where a probe, run once per model and "
              "machine and cached, shows this machine runs them), on, off",
              choices=AUTO_ON_OFF)
KV_CACHE_TYPE = Flag("--kv-cache-type", "runner.kv_cache_type", "KV cache values: f16, "
                     "q8_0 (half the memory, nearly lossless; on --backend mlx it is MLX's "
                     "8-bit affine quantization, group 64) or q4_0 (a quarter, lossier; "
                     "llama.cpp only); on llama.cpp a quantized cache turns flash attention "
                     "on (README, \"KV cache quantization\")", choices=KV_CACHE_TYPES)
FLASH_ATTN = Flag("--flash-attn", "runner.flash_attn", "llama.cpp flash attention: auto "
                  "(llama.cpp decides: on for the CPU, as llama-server), on, off. On a CPU "
                  "a step of n tokens with it on reads the whole KV cache once per token, so "
                  "off makes long-context verify steps cheaper (README, \"Predicted "
                  "Outputs on a whole file\"); a quantized KV cache needs it",
                  choices=AUTO_ON_OFF)
EXACT = Flag("--exact", "runner.exact", "logits independent of how steps are grouped: the "
             "same tokens batched or alone, cached or cold, with speculation or without "
             "(flash attention and repacked weights off, llama.cpp built without tinyBLAS: "
             "`install.sh --exact`; README, \"Same answer every time\")", None,
             action="store_true")
MAX_CONCURRENCY = Flag("--max-concurrency", "runner.max_seqs", "sequences decoded together "
                       "in one batch", positive_int, metavar="N")
MAX_QUEUE = Flag("--max-queue", "max_waiting", "requests allowed to wait for a batch slot; "
                 "beyond that requests get 503", non_negative_int, metavar="N")

SPEC = Flag("--spec", "spec.mode", "speculative decoding: auto (drafts from n-gram prompt "
            "lookup, a request's prediction or earlier requests' outputs (the suffix "
            "index), only as many per step as this machine's "
            "measured step time says pay, plus the --draft-model where those have none), "
            "ngram (no draft model), draft (only the draft model), off, or fixed:K (K "
            "drafts whenever there are any)", metavar="MODE")
DRAFT_MODEL = Flag("--draft-model", "draft_model", "a smaller model with the same "
                   "vocabulary that drafts tokens for speculative decoding (registry name or "
                   ".gguf path)", metavar="NAME_OR_PATH")
NUM_DRAFT_TOKENS = Flag("--num-draft-tokens", "spec.num_draft_tokens", "most draft tokens "
                        "per sequence and step", positive_int, metavar="K")
SUFFIX_TOKENS = Flag("--suffix-tokens", "spec.suffix_tokens", "memory cap of the suffix "
                     "index of earlier requests' outputs that drafts for later ones, in "
                     "tokens (about 830 bytes each); 0 turns it off", non_negative_int,
                     metavar="N")

# the flags every command that loads a model takes
COMMON = (MODEL, BACKEND, CTX_SIZE, THREADS, KV_LAYOUT, KV_CACHE_TYPE, FLASH_ATTN, REPACK, EXACT,
          SPEC, DRAFT_MODEL, NUM_DRAFT_TOKENS, SUFFIX_TOKENS)


def default_of(field: str, defaults: EngineArgs | None = None) -> Any:
    obj: Any = defaults or EngineArgs()
    for part in field.split("."):
        obj = getattr(obj, part)
    return obj


def add_engine_args(parser: argparse.ArgumentParser, flags=COMMON,
                    defaults: EngineArgs | None = None) -> None:
    """Add `flags` to `parser`, defaults taken from `defaults` (or `EngineArgs()`) and
    stated in each help text."""
    for flag in flags:
        default = default_of(flag.field, defaults)
        shown = "automatic" if default is None else "off" if default is False else default
        names = [flag.name] + ([flag.short] if flag.short else [])
        kwargs: dict[str, Any] = {"default": default, "help": f"{flag.help} (default: {shown})",
                                  "dest": flag.dest}
        if flag.action:
            kwargs["action"] = flag.action
        elif flag.choices:
            kwargs["choices"] = flag.choices
        elif flag.type is not None:
            kwargs["type"] = flag.type
        if flag.metavar:
            kwargs["metavar"] = flag.metavar
        parser.add_argument(*names, **kwargs)


def engine_args_from(ns: argparse.Namespace, flags=COMMON, **overrides: Any) -> EngineArgs:
    """An `EngineArgs` from parsed flags; `overrides` ({dotted field: value}, dots written
    as `__`) set what a command decides itself, e.g. `runner__max_seqs=1` for `run`.
    With `--exact`, picks the exact llama.cpp library (`backends.llamacpp.exact`) before
    anything loads llama.cpp. Raises ValueError for an invalid combination, or `--exact`
    without its library."""
    args = EngineArgs()
    values = {flag.field: getattr(ns, flag.dest) for flag in flags if hasattr(ns, flag.dest)}
    values.update({k.replace("__", "."): v for k, v in overrides.items()})
    for field, value in values.items():
        obj: Any = args
        *parents, last = field.split(".")
        for part in parents:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    from app.commands.peer_flags import peer_from

    args.prefill_peer = peer_from(ns)
    args.runner.__post_init__()
    args.spec.__post_init__()
    args.__post_init__()
    if args.runner.exact:
        from backends.llamacpp.exact import NOT_ON_MLX, select_library

        if args.backend == "mlx":  # before the library, which is llama.cpp's
            raise ValueError(NOT_ON_MLX)

        select_library()
    return args
