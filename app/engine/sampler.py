"""Vectorised token sampling over a batch of logits rows (numpy, no backend).

Order of operations per row, as vLLM applies them:

1. OpenAI's `logit_bias` added to the raw logits (as llama.cpp's first sampler does), then
   penalties — repetition (CTRL, Keskar et al. 2019, as llama.cpp applies
   it: over the last `repeat_last_n` tokens of prompt + output, a positive logit is divided by
   the penalty, a non-positive one multiplied), then presence/frequency (OpenAI: ``logit -= freq * count + presence * (count
   > 0)`` over output tokens);
2. greedy rows (``temperature < 1e-5``, vLLM's threshold) take the argmax, ties to the lowest id;
3. sampled rows: temperature, top-k, top-p (nucleus: Holtzman et al. 2020), min-p (Nguyen et
   al. 2024), then one draw with the row's own generator.

Each row owns its `numpy.random.Generator` and draws exactly one ``rng.random()`` per sampled
token. The engine gives each row the generator of its output position (`position_rng`:
counter-based, keyed by the request's seed and the position), so a seeded request gives the
same tokens whatever else is in the batch, and whether or not speculation verified the
position in a multi-token step. Logprobs are the
log-softmax of the penalised logits before temperature and filters ("raw" logprobs, as OpenAI
and vLLM report them).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from app.engine.types import SamplingParams

# Below this temperature a row is sampled greedily (vLLM's _SAMPLING_EPS); dividing by a
# denormal temperature would otherwise turn the distribution into NaNs.
GREEDY_TEMPERATURE = 1e-5

# Cumulative-probability slack for top-p, so that float rounding of e.g. 0.5 + 0.3 to
# 0.79999995 does not pull one more token into a top_p=0.8 nucleus.
_TOP_P_TOLERANCE = 1e-6

# Distributions longer than this are drawn from in two levels (chunk sums, then one chunk):
# a sequential cumsum over a 50k-150k vocabulary costs more than the rest of the row.
_DRAW_CHUNK = 1024

# Logit gaps below the row maximum tried as cheap pre-filters before an exact top-k selection.
_TOP_K_GAPS = (8.0, 16.0, 32.0)

# Relative-probability thresholds tried as cheap pre-filters before sorting for top-p.
_TOP_P_FLOORS = (1e-3, 1e-6)


@dataclass(slots=True)
class SampleResult:
    """Output of `sample` for a batch of B rows.

    `token_ids` is ``[B]`` int64. `logprobs[i]` is None unless ``params[i].logprobs`` is set;
    then it is ``(chosen token's logprob, [(token_id, logprob), ...])`` with the top list
    sorted by descending logprob, ``params[i].logprobs`` long (natural log).
    """

    token_ids: np.ndarray
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


def make_rng(seed: int | None) -> np.random.Generator:
    """A request's own generator: seeded (reproducible) or, for None, from fresh OS entropy."""
    return np.random.default_rng(seed)


_U64 = (1 << 64) - 1


def seed_key(seed: int | None) -> int:
    """A request's 128-bit random key: its seed (taken modulo 2**128) or, for None, 64 fresh
    bits from the OS."""
    return secrets.randbits(64) if seed is None else seed & ((1 << 128) - 1)


def position_rng(key: int, position: int, stream: int = 0) -> np.random.Generator:
    """The generator for one output position of a request: Philox (Salmon et al. 2011,
    counter-based) keyed by `key`, counter `(0, position, stream, 0)`. Draws at a position
    depend only on (key, position, stream), never on how many draws other positions made;
    successive draws advance the low counter word, so positions never overlap. `stream`
    separates uses at one position (e.g. 0: the target token, 1: a rejection-sampling
    acceptance draw)."""
    bits = np.random.Philox(key=np.array([key & _U64, key >> 64], dtype=np.uint64),
                            counter=np.array([0, position, stream, 0], dtype=np.uint64))
    return np.random.Generator(bits)


def has_penalties(params: SamplingParams) -> bool:
    """Whether `logit_bias` or any of repetition/presence/frequency penalty changes the
    logits (such a row leaves the all-greedy ``argmax`` fast path)."""
    return (
        (params.repetition_penalty != 1.0 and params.repeat_last_n != 0)
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or bool(params.logit_bias)
    )


def apply_penalties(
    logits: np.ndarray,
    params: SamplingParams,
    prompt_ids: list[int],
    output_ids: list[int],
) -> np.ndarray:
    """Biased and penalised copy of one logits row ``[V]``; the input is never modified.

    `logit_bias` {id: b} first adds b to each listed token's logit (OpenAI). Repetition
    penalty r (CTRL, Keskar et al. 2019, applied as llama.cpp does): for every distinct
    token among the last `repeat_last_n` of prompt + output (-1: all of them, 0: none), a
    logit > 0 becomes logit / r, else logit * r, clipped to the dtype's finite range
    (r = 1e-300 makes the seen tokens' logits the largest finite value, not inf).
    Presence p and frequency f (OpenAI): for each distinct output token seen c times,
    logit -= f * c + p. Returns `logits` itself (not a copy) when no penalty is active.
    Raises ValueError if a token id is outside ``[0, V)``.
    """
    if not has_penalties(params):
        return logits
    out = np.array(logits, copy=True)
    vocab = out.shape[-1]
    if params.logit_bias:
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        _check_ids(ids, vocab)
        out[ids] += np.fromiter(params.logit_bias.values(), dtype=out.dtype, count=ids.size)
    if params.repetition_penalty != 1.0 and params.repeat_last_n != 0:
        seen = penalty_window(prompt_ids, output_ids, params.repeat_last_n)
        if seen.size:
            _check_ids(seen, vocab)
            # Duplicate indices are harmless: each write stores the same value, computed from
            # the original logit, so a repeated token is penalised once.
            v = out[seen]
            r = params.repetition_penalty
            # clipped: a penalty near 0 (or huge) must not overflow a logit to inf, which
            # would leave the row nothing to sample from
            limit = np.finfo(out.dtype).max
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                out[seen] = np.clip(np.where(v > 0, v / r, v * r), -limit, limit)
    if (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0) and len(output_ids):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        _check_ids(ids, vocab)
        out[ids] -= params.frequency_penalty * counts + params.presence_penalty
    return out


def penalty_window(prompt_ids: list[int], output_ids: list[int], last_n: int) -> np.ndarray:
    """The last `last_n` tokens of prompt + output (all of them for -1) as int64 ``[<= n]``:
    what the repetition penalty covers (llama.cpp's `penalty_last_n`)."""
    if last_n < 0:
        return np.concatenate((np.asarray(prompt_ids, dtype=np.int64),
                               np.asarray(output_ids, dtype=np.int64)))
    out = output_ids[len(output_ids) - last_n:] if len(output_ids) > last_n else output_ids
    rest = last_n - len(out)
    head = prompt_ids[max(len(prompt_ids) - rest, 0):] if rest > 0 else []
    return np.concatenate((np.asarray(head, dtype=np.int64), np.asarray(out, dtype=np.int64)))


def sample(
    logits: np.ndarray,
    params: list[SamplingParams],
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
    rngs: list[np.random.Generator],
) -> SampleResult:
    """Pick one next token per row.

    `logits` is ``[B, V]`` (float32 usually) and may be a read-only view of a backend buffer:
    it is only read. `params`, `prompt_ids`, `output_ids` (tokens generated so far) and `rngs`
    have one entry per row; only sampled rows consume their generator, one ``random()`` each.
    Returns a `SampleResult`. Raises ValueError on mismatched lengths, a non-2-D `logits`, an
    out-of-range penalty or logit_bias token id, or a sampled row whose largest logit is NaN or -inf.

    All-greedy batches without penalties, logit_bias or logprobs are one ``argmax`` over
    ``[B, V]`` (the engine takes the same shortcut itself for decode steps without drafts).
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {logits.shape}")
    batch = logits.shape[0]
    if not (len(params) == len(prompt_ids) == len(output_ids) == len(rngs) == batch):
        raise ValueError(
            f"{batch} logits rows but {len(params)} params, {len(prompt_ids)} prompts, "
            f"{len(output_ids)} outputs, {len(rngs)} generators"
        )

    plain_greedy = [is_plain_greedy(p) for p in params]
    if all(plain_greedy):
        return SampleResult(np.argmax(logits, axis=1).astype(np.int64, copy=False), [None] * batch)

    tokens = np.empty(batch, dtype=np.int64)
    rows = [i for i in range(batch) if plain_greedy[i]]
    if rows:
        tokens[rows] = np.argmax(logits[rows], axis=1)

    logprobs: list[tuple[float, list[tuple[int, float]]] | None] = [None] * batch
    for i in range(batch):
        if plain_greedy[i]:
            continue
        p = params[i]
        row = apply_penalties(logits[i], p, prompt_ids[i], output_ids[i])
        if p.temperature < GREEDY_TEMPERATURE:
            token = int(np.argmax(row))
        else:
            token = _sample_row(row, p, rngs[i])
        tokens[i] = token
        if p.logprobs is not None:
            logprobs[i] = _logprobs(row, token, p.logprobs)
    return SampleResult(tokens, logprobs)


def is_plain_greedy(p: SamplingParams) -> bool:
    """Whether rows with `p` are a bare argmax: greedy, no penalties, logit_bias or logprobs."""
    return p.temperature < GREEDY_TEMPERATURE and p.logprobs is None and not has_penalties(p)


def _check_ids(ids: np.ndarray, vocab: int) -> None:
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"token id out of range for a vocabulary of {vocab}")


def _sample_row(row: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """Temperature, top-k, top-p, min-p, then one draw; returns the token id."""
    ids, probs = filtered_weights(row, p)
    j = draw(probs, rng.random())
    return int(j if ids is None else ids[j])


def filtered_weights(row: np.ndarray, p: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """The distribution a sampled row draws from, for penalised logits `row` ``[V]``:
    (candidate token ids, or None for all of 0..V-1; their unnormalised weights), after
    temperature, top-k, top-p and min-p. Raises ValueError if the row's largest logit is
    NaN or -inf."""
    vocab = row.shape[0]
    top = row.max()
    if not np.isfinite(top):
        raise ValueError("cannot sample a row whose largest logit is NaN or -inf")
    ids: np.ndarray | None  # candidate token ids, or None for "all of 0..V-1"
    if 0 < p.top_k < vocab:
        ids = top_k_ids(row, p.top_k)
        z = (row[ids].astype(np.float64) - top) / p.temperature
    else:
        ids = None
        # Max subtracted first: the best token gets exactly 0 and, with temperature >= 1e-5,
        # nothing overflows to inf/NaN. In place, float32: this is the per-row hot loop.
        z = np.subtract(row, top, dtype=np.float32)
        z *= np.float32(1.0 / p.temperature)
    probs = np.exp(z, out=z)  # unnormalised: `draw` and min-p only need ratios
    if p.top_p < 1.0:
        ids, probs = _top_p(ids, probs / probs.sum(), p.top_p)
    if p.min_p > 0.0:
        keep = np.flatnonzero(probs >= p.min_p * probs.max())
        ids = keep if ids is None else ids[keep]
        probs = probs[keep]
    return ids, probs


def distribution(row: np.ndarray, p: SamplingParams, prompt_ids: list[int],
                 output_ids: list[int]) -> np.ndarray:
    """The full next-token distribution ``[V]`` float64 (sums to 1) the sampler draws from
    for raw logits `row`: penalties over the history, then `filtered_weights`; a greedy row
    puts all mass on its argmax. Used by rejection sampling, which needs p and q."""
    row = apply_penalties(row, p, prompt_ids, output_ids)
    out = np.zeros(row.shape[0], dtype=np.float64)
    if p.temperature < GREEDY_TEMPERATURE:
        out[int(np.argmax(row))] = 1.0
        return out
    ids, w = filtered_weights(row, p)
    w = np.asarray(w, dtype=np.float64)
    if ids is None:
        out[:] = w
    else:
        out[ids] = w
    return out / out.sum()


def top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the `k` largest entries of a 1-D array, ascending by id; O(V), no full sort.

    A threshold pass (entries within a few logits of the max) usually leaves a few hundred
    candidates, so the exact `argpartition` runs on those instead of the whole vocabulary.
    Which of several tied entries at the k-th place is kept is arbitrary but deterministic.
    """
    n = x.shape[0]
    if k >= n:
        return np.arange(n)
    top = x.max()
    cand = None
    for gap in _TOP_K_GAPS:
        c = np.flatnonzero(x >= top - gap)
        if c.size >= k:
            cand = c
            break
    if cand is None:
        cand = np.arange(n)
    if cand.size > k:
        cand = cand[np.argpartition(x[cand], cand.size - k)[cand.size - k :]]
    return np.sort(cand)


def _top_p(
    ids: np.ndarray | None, probs: np.ndarray, top_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest set, most likely first, whose probability sum reaches `top_p` (>= 1 token).

    `probs` is normalised over the candidates (`ids`, or the whole vocabulary for None).
    Tokens below a small fraction of the max are skipped unless the rest falls short of
    `top_p`; the nucleus, taken in descending order, cannot reach them otherwise.
    """
    need = top_p - _TOP_P_TOLERANCE
    sel = None
    pmax = probs.max()
    for floor in _TOP_P_FLOORS:
        c = np.flatnonzero(probs >= pmax * floor)
        if probs[c].sum() >= need:
            sel = c
            break
    if sel is None:
        sel = np.arange(probs.shape[0])
    ps = probs[sel].astype(np.float64)
    order = np.argsort(-ps, kind="stable")  # ties: lowest position first
    sel, ps = sel[order], ps[order]
    n = min(int(np.searchsorted(np.cumsum(ps), need, side="left")) + 1, ps.shape[0])
    sel, ps = sel[:n], ps[:n]
    return (sel if ids is None else ids[sel]), ps


def draw(weights: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: index j with cum[j-1] <= u * total < cum[j] for weights ``[N]`` >= 0.

    `u` is uniform in [0, 1); weights need not be normalised. A zero-weight entry is never
    returned. Long arrays are searched in two levels (chunk sums, then one chunk's cumsum),
    which costs O(N) vectorised work instead of an O(N) sequential cumsum.
    """
    n = weights.shape[0]
    if n <= _DRAW_CHUNK:
        cum = np.cumsum(weights, dtype=np.float64)
        return _search(weights, u * cum[-1], cum)
    starts = np.arange(0, n, _DRAW_CHUNK)
    sums = np.add.reduceat(weights, starts)
    cum = np.cumsum(sums, dtype=np.float64)
    target = u * cum[-1]
    c = _search(sums, target, cum)
    rest = target - (cum[c - 1] if c else 0.0)
    start = int(starts[c])
    return start + _search(weights[start : start + _DRAW_CHUNK], rest)


def _search(weights: np.ndarray, target: float, cum: np.ndarray | None = None) -> int:
    if cum is None:
        cum = np.cumsum(weights, dtype=np.float64)
    # side="right" skips zero-weight entries: their cum equals the previous one.
    j = int(np.searchsorted(cum, target, side="right"))
    if j >= weights.shape[0]:  # rounding put target at the very end: last non-zero entry
        j = int(np.flatnonzero(weights)[-1])
    return j


def _logprobs(row: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """(logprob of `token`, top-`k` [(id, logprob)] descending) from log_softmax(row).

    Tokens at -inf (forbidden by a grammar mask) are left out of the top list, which can
    then be shorter than `k`: they have no probability, and -inf is not valid JSON."""
    top = float(row.max())
    lse = top + float(np.log(np.exp(row - top).sum()))  # numpy's sum is pairwise: accurate
    ids = top_k_ids(row, k) if k > 0 else np.empty(0, dtype=np.int64)
    ids = ids[np.isfinite(row[ids])]
    vals = row[ids].astype(np.float64) - lse
    order = np.argsort(-vals, kind="stable")  # ids ascending, so ties list the lowest id first
    top_list = [(int(ids[o]), float(vals[o])) for o in order]
    return float(row[token]) - lse, top_list
