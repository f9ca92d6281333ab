"""`EngineArgs`: everything needed to build an engine, in one validated object.

Every entry point (CLI commands, the TUI, the benches) fills one and hands it to
`app.loader.load_engine`; CLI flags map onto its fields in one place
(`app.commands.engine_flags`). The engine core's own configs (`SchedulerConfig`,
`EngineConfig`) and the runner's (`RunnerConfig`) are derived from it, so no default is
written twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.disagg.peer import PeerConfig
from app.engine.config import EngineConfig, SchedulerConfig, SpecConfig
from backends.base import KV_TRANSFER_DTYPES, RunnerConfig
from models.registry import DEFAULT_MODEL


def two_box_kv_refusal(kv_cache_type: str, where: str) -> str:
    """Why two-box mode refuses a KV cache type the wire cannot carry (one line); `where`:
    "with --prefill-peer" or "by prefill-worker"."""
    return (f"two-box mode sends f16 or q8_0 KV; --kv-cache-type {kv_cache_type} is not "
            f"supported {where}")


def check_two_box_kv(kv_cache_type: str, backend: str | None, where: str) -> None:
    """Raises ValueError (one line) when two-box mode cannot carry this KV cache: q4_0 on
    any backend, q8_0 on MLX (MLX 8-bit affine, not the wire's llama.cpp blocks). `backend`
    None (not chosen yet) checks the type only; `where` as `two_box_kv_refusal`."""
    if kv_cache_type not in KV_TRANSFER_DTYPES:
        raise ValueError(two_box_kv_refusal(kv_cache_type, where))
    if backend == "mlx":
        from backends.mlx.runner import kv_transfer_refusal

        reason = kv_transfer_refusal(kv_cache_type)
        if reason is not None:
            raise ValueError(f"{reason} {where}")


@dataclass(slots=True)
class EngineArgs:
    """Args:
    model: registry name, path to a .gguf file, or an MLX model directory.
    backend: "llamacpp" | "mlx" | None (automatic, see backends.select).
    runner: slots, context, KV layout, threads (see RunnerConfig); `runner.max_seqs` is
        also the scheduler's batch size and `runner.seq_tokens` the context window.
    max_waiting: requests allowed to wait beyond the running ones.
    enable_prefix_caching: reuse cached prompt blocks.
    spec: speculative decoding (mode, draft cap).
    draft_model: a draft model for speculative decoding (registry name or path), with the
        target's vocabulary; None: no draft model.
    prefill_peer: a `tandem prefill-worker` that prefills long prompts (two-box mode);
        None: every prompt is prefilled here. Only with a KV cache the wire carries
        (`check_two_box_kv`).
    Raises ValueError (in `__post_init__`) for values out of range.
    """

    model: str = DEFAULT_MODEL
    backend: str | None = None
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    max_waiting: int = 256
    enable_prefix_caching: bool = True
    spec: SpecConfig = field(default_factory=SpecConfig)
    draft_model: str | None = None
    prefill_peer: PeerConfig | None = None

    def __post_init__(self) -> None:
        if self.backend not in (None, "llamacpp", "mlx"):
            raise ValueError(f"backend must be llamacpp or mlx, not {self.backend!r}")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        if not self.model:
            raise ValueError("model must be given")
        if self.spec.mode == "draft" and not self.draft_model:
            raise ValueError("--spec draft needs --draft-model")
        if self.prefill_peer is not None and self.draft_model:
            raise ValueError("--prefill-peer cannot be combined with --draft-model (the draft "
                             "model's KV would be missing for imported positions)")
        if self.prefill_peer is not None:
            check_two_box_kv(self.runner.kv_cache_type, self.backend, "with --prefill-peer")

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.runner.max_seqs,
            max_num_batched_tokens=self.runner.max_batch_tokens,
            max_waiting=self.max_waiting,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            context_length=self.runner.seq_tokens,
            scheduler=self.scheduler_config(),
            enable_prefix_caching=self.enable_prefix_caching,
        )


def check_worker_kv(args: EngineArgs, backend: str | None = None) -> None:
    """A `tandem prefill-worker`'s engine on `backend` (default `args.backend`): raises
    ValueError (one line) for a KV cache the two-box wire cannot carry (`check_two_box_kv`)."""
    check_two_box_kv(args.runner.kv_cache_type, backend or args.backend, "by prefill-worker")
