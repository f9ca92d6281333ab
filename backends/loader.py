"""Load a model file onto the chosen backend's runner."""

from __future__ import annotations

from pathlib import Path

from backends.base import Runner, shared_pool_tokens

# MLX blocks are real pages that attention gathers: 16 tokens (vLLM's default) keeps the
# gathers large. llama.cpp's default is finer (backends.llamacpp.runner.BLOCK_SIZE).
MLX_BLOCK_SIZE = 16


def _choose(requested: str | None) -> str:
    try:
        from backends.select import select_backend
    except ImportError:
        return requested or "llamacpp"
    choice = select_backend(requested)
    return choice[0] if isinstance(choice, tuple) else choice


def load_runner(
    path: str | Path,
    *,
    backend: str | None = None,
    max_seqs: int = 64,
    kv_tokens: int | None = None,
    seq_tokens: int = 4096,
    kv_layout: str = "auto",
    block_size: int | None = None,
    max_batch_tokens: int = 512,
    n_threads: int | None = None,
    flash_attn: str = "auto",
) -> tuple[Runner, str]:
    """Returns (runner, backend name). `seq_tokens` and `kv_layout` are llama.cpp's (see
    LlamaCppRunner); MLX has one paged pool of `kv_tokens`. `block_size` defaults to
    the runner's (llama.cpp 8, MLX 16). Raises FileNotFoundError / ValueError (bad
    model)."""
    name = _choose(backend)
    if name == "mlx":
        from backends.mlx.runner import load_mlx_runner
        from models.convert import converted_dir, is_current

        converted = converted_dir(path)  # `tandem models convert --to mlx` output, if current
        if str(path).endswith(".gguf") and is_current(converted, path):
            path = converted
        kv_tokens = kv_tokens or shared_pool_tokens(seq_tokens)
        block_size = MLX_BLOCK_SIZE if block_size is None else block_size
        runner = load_mlx_runner(str(path), max_seqs=max_seqs,
                                 num_blocks=kv_tokens // block_size, block_size=block_size)
        return runner, name
    from backends.llamacpp.runner import BLOCK_SIZE, LlamaCppRunner

    runner = LlamaCppRunner(
        path, max_seqs=max_seqs, kv_tokens=kv_tokens, seq_tokens=seq_tokens,
        kv_layout=kv_layout, block_size=BLOCK_SIZE if block_size is None else block_size,
        max_batch_tokens=max_batch_tokens, n_threads=n_threads, flash_attn=flash_attn,
    )
    return runner, name
