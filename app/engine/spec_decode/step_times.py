"""The step-time curve refined from the engine's own steps, per batch-size bucket.

The start-up profile measures t(n) for one sequence at a 128-token context on a scratch
slot; real steps run at other contexts, with other batch shapes, beside whatever else the
machine is doing. Every decode or verification step the engine runs (each of its tokens with
logits) is one observation of t(n) for its bucket of sequences (1, 2, 3-4, 5-8, ...). Each
(bucket, n) keeps an exponentially weighted moving average (EWMA) of what was observed: a
step's weight decays by 1 - ALPHA per later observation of the same point, and an
observation is first clipped to [1/CLIP, CLIP] x the current estimate (the first one: x the
profile's value at n), so one step slowed by a burst of other work moves it by at most
ALPHA x (CLIP - 1). Past EXACT_TOKENS a step counts at the nearest point of a grid of
three per octave (10, 12, 16, 20, 24, 32, ...; `grid_point`), its time scaled by the
profile's t(point) / t(n): with many sequences the verify steps rarely repeat an n, and
without the grid no point past the profile's last would ever gather MIN_SAMPLES. An
estimate with MIN_SAMPLES observations replaces the profile's value at its n in that
bucket's curve; the other points are the profile's scaled to the nearest estimate
(`_rescaled`).

Curves are published (rebuilt) only when an estimate first counts or moves more than
PUBLISH_CHANGE from the value the published curve has, so the controller's per-shape
decisions can be cached between changes (`version`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from app.engine.spec_decode.controller import StepTimeCurve

ALPHA = 0.125  # EWMA weight of a new observation (a step's weight halves in ~5 more)
CLIP = 2.0  # an observation counts as at most CLIP x (at least 1/CLIP x) the estimate
MIN_SAMPLES = 4  # observations before an estimate replaces the profile's point
PUBLISH_CHANGE = 0.05  # relative move of an estimate that rebuilds its bucket's curve
SAVE_EVERY = 256  # observations between two `persist` calls (while anything changed)
EXACT_TOKENS = 8  # steps of up to this many tokens count at their own n (the drafts of one)


def grid_point(num_tokens: int) -> int:
    """The point a step of `num_tokens` tokens counts at: itself up to EXACT_TOKENS, else
    the nearest (by ratio; the lower on a tie) of m x 2^j for m in 4, 5, 6."""
    if num_tokens <= EXACT_TOKENS:
        return num_tokens
    octave = 1 << (num_tokens.bit_length() - 1)  # <= num_tokens < 2 x octave
    candidates = [octave * m // 4 for m in (4, 5, 6, 8)]  # the next octave's first too
    return min(candidates, key=lambda g: (max(g / num_tokens, num_tokens / g), g))


def batch_bucket(num_seqs: int) -> int:
    """The bucket of a step with `num_seqs` sequences: the least power of two >= it (1, 2,
    4, 8, ...)."""
    return 1 << max(num_seqs - 1, 0).bit_length()


class OnlineStepTimes:
    """Args:
    base: the profile's {n: seconds} (one sequence); at least one point.
    estimates: persisted {bucket: {n: (seconds, observations)}} to start from.
    persist: called with `snapshot()` every SAVE_EVERY observations when an estimate changed
        since the last call (the profile file is rewritten; errors are the callee's).
    Raises ValueError for an empty or non-positive `base` (as `StepTimeCurve`).
    """

    def __init__(self, base: Mapping[int, float],
                 estimates: Mapping[int, Mapping[int, tuple[float, int]]] | None = None,
                 persist: Callable[[dict[int, dict[int, tuple[float, int]]]], None] | None = None):
        self.base = {int(n): float(t) for n, t in base.items()}
        self.base_curve = StepTimeCurve(self.base)
        self.estimates: dict[int, dict[int, list[float]]] = {  # saved off the grid: dropped
            int(b): {int(n): [float(t), int(c)] for n, (t, c) in pts.items()
                     if t > 0 and grid_point(int(n)) == int(n)}
            for b, pts in (estimates or {}).items()}
        self.persist = persist
        self.version = 0  # incremented whenever a published curve changes
        self._curves: dict[int, StepTimeCurve] = {}
        self._published: dict[int, dict[int, float]] = {}
        self._unsaved = 0

    def observe(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        """One step that computed `num_tokens` tokens (all with logits) for `num_seqs`
        sequences in `seconds`."""
        if num_tokens < 1 or num_seqs < 1 or not seconds > 0:
            return
        point = grid_point(num_tokens)
        if point != num_tokens:
            seconds *= self.base_curve(point) / self.base_curve(num_tokens)
            num_tokens = point
        bucket = batch_bucket(num_seqs)
        points = self.estimates.setdefault(bucket, {})
        est = points.get(num_tokens)
        if est is None:  # the first is clipped against the profile, so one slow step
            # beside another process cannot set the estimate that later ones move from
            ref = self.base_curve(num_tokens)
            points[num_tokens] = est = [min(max(seconds, ref / CLIP), ref * CLIP), 1]
        else:
            x = min(max(seconds, est[0] / CLIP), est[0] * CLIP)
            est[0] += ALPHA * (x - est[0])
            est[1] += 1
        if est[1] >= MIN_SAMPLES and bucket in self._curves:  # else built afresh when asked
            shown = self._published[bucket].get(num_tokens)
            if shown is None or abs(est[0] - shown) > PUBLISH_CHANGE * shown:
                self._curves.pop(bucket, None)
                self.version += 1
        self._unsaved += 1
        if self.persist is not None and self._unsaved >= SAVE_EVERY:
            self._unsaved = 0
            self.persist(self.snapshot())

    def curve(self, num_seqs: int = 1) -> StepTimeCurve:
        """The curve for a step of `num_seqs` sequences: its bucket's estimates that have
        MIN_SAMPLES observations, and the profile's other points scaled to them
        (`_rescaled`); the profile alone while none has."""
        bucket = batch_bucket(num_seqs)
        curve = self._curves.get(bucket)
        if curve is None:
            used = {n: t for n, (t, c) in self.estimates.get(bucket, {}).items()
                    if c >= MIN_SAMPLES}
            self._published[bucket] = used
            curve = self._curves[bucket] = (StepTimeCurve(self._rescaled(used)) if used
                                            else self.base_curve)
        return curve

    def _rescaled(self, used: Mapping[int, float]) -> dict[int, float]:
        """The estimates `used` ({n: seconds}, not empty), and each profile point they lack
        scaled by estimate / profile at the nearest n they have (the lower on a tie). The
        profile gives the curve's shape, the engine's steps its level: a profile measured
        while the machine was busy (t(1) 53 ms against 36 ms observed later, Qwen2.5-1.5B)
        would otherwise pair an observed t(1) with busy t(2..8) and look 1.5x steeper than
        it is, and `auto` would stop drafting, so t(2) would never be observed to mend it."""
        known = sorted(used)
        points = dict(used)
        for n, t in self.base.items():
            if n not in points:
                ref = min(known, key=lambda k: (abs(k - n), k))
                points[n] = t * used[ref] / self.base_curve(ref)
        return points

    def snapshot(self) -> dict[int, dict[int, tuple[float, int]]]:
        """{bucket: {n: (seconds, observations)}}, for the profile file."""
        return {b: {n: (t, int(c)) for n, (t, c) in sorted(pts.items())}
                for b, pts in sorted(self.estimates.items()) if pts}
