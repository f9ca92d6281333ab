"""The sampling flags of `tandem run`, in one place: each states its default and unit in
`--help`, and argparse checks its range, so an error names the flag (`--top-p`), never the
API field (`top_p`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from app.commands.engine_flags import non_negative_int, positive_int
from models.registry import DEFAULT_MAX_TOKENS


def float_in(low: float, high: float | None = None, low_open: bool = False) -> Callable[[str], float]:
    """argparse type: a float in [low, high] ((low, high] when `low_open`; no upper bound
    when `high` is None)."""
    shown = f"{'(' if low_open else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {shown}, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        if too_low or (high is not None and value > high) or value != value:
            raise argparse.ArgumentTypeError(f"expected a number in {shown}, got {text!r}")
        return value

    return parse


def int_at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


MODEL_DEFAULT = "the model's recommended value, see `tandem models list`"


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int = DEFAULT_MAX_TOKENS,
                      temperature: float | None = None, top_p: float | None = None,
                      top_k: int | None = None, min_p: float | None = None) -> None:
    """`--max-tokens --temperature --top-p --top-k --min-p --repetition-penalty
    --repeat-last-n --seed --stop`. A sampling default of None (the default) means the model's recommended value
    (`models.registry.generation_defaults`; resolve with `sampling_values`)."""
    def shown(value: object) -> object:
        return MODEL_DEFAULT if value is None else value

    add = parser.add_argument
    add("--max-tokens", type=positive_int, default=max_tokens, metavar="N",
        help=f"stop after N generated tokens (default: {max_tokens})")
    add("--temperature", type=float_in(0.0), default=temperature, metavar="T",
        help=f"softmax temperature; 0 is greedy (default: {shown(temperature)})")
    add("--top-p", type=float_in(0.0, 1.0, low_open=True), default=top_p, metavar="P",
        help=f"nucleus sampling: keep the most likely tokens whose probabilities sum to P, "
        f"0 < P <= 1; 1 disables it (default: {shown(top_p)})")
    add("--top-k", type=non_negative_int, default=top_k, metavar="K",
        help=f"keep the K most likely tokens; 0 disables it (default: {shown(top_k)})")
    add("--min-p", type=float_in(0.0, 1.0), default=min_p, metavar="P",
        help=f"drop tokens less likely than P x the most likely one's probability, "
        f"0 <= P <= 1; 0 disables it (default: {shown(min_p)})")
    add("--repetition-penalty", type=float_in(0.0, low_open=True), default=None, metavar="R",
        help="divide the logits of tokens already in the prompt or reply by R (llama.cpp's "
        f"repeat penalty); 1 disables it (default: {MODEL_DEFAULT})")
    add("--repeat-last-n", type=int_at_least(-1), default=None, metavar="N",
        help="the repetition penalty looks back over the last N tokens of prompt and reply; "
        f"-1: all of them, 0: none (default: {MODEL_DEFAULT}, 64)")
    add("--seed", type=int, default=None, metavar="N",
        help="random seed, for reproducible sampling (default: none, a fresh draw each run)")
    add("--stop", action="append", default=[], metavar="TEXT",
        help="stop string, never printed; repeatable (default: none)")


def sampling_values(args: argparse.Namespace) -> dict[str, float | int]:
    """temperature, top_p, top_k, min_p, repetition_penalty and repeat_last_n for
    `SamplingParams`: each
    flag given, else the recommended value of `args.model` (`models.registry`)."""
    from models.registry import generation_defaults

    d = generation_defaults(getattr(args, "model", None))
    values = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "repeat_last_n"):
        flag = getattr(args, name, None)
        values[name] = getattr(d, name) if flag is None else flag
    return values
