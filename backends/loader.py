"""Load a model file onto the chosen backend's runner."""

from __future__ import annotations

from pathlib import Path

from backends.base import Runner, shared_pool_tokens

# Tokens per engine block: the granularity of prefix-cache hits. llama.cpp's blocks are only
# accounting (its KV lives in its own cells), so finer blocks cost just bookkeeping and reuse
# more of a shared prefix (llama-server reuses to the token): a 26-token common chat prefix
# hits 24 tokens, not 16, saving ~25 ms of TTFT per request here. MLX blocks are real pages
# that attention gathers, where 16 (vLLM's default) keeps the gathers large.
LLAMACPP_BLOCK_SIZE = 8
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
    `LLAMACPP_BLOCK_SIZE` or `MLX_BLOCK_SIZE`. Raises FileNotFoundError / ValueError (bad
    model)."""
    name = _choose(backend)
    if name == "mlx":
        from backends.mlx.runner import load_mlx_runner
        from models.convert import converted_dir, is_current

        converted = converted_dir(path)  # `tandem models convert --to mlx` output, if current
        if str(path).endswith(".gguf") and is_current(converted, path):
            path = converted
        kv_tokens = kv_tokens or shared_pool_tokens(seq_tokens)
        block_size = block_size or MLX_BLOCK_SIZE
        runner = load_mlx_runner(str(path), max_seqs=max_seqs,
                                 num_blocks=kv_tokens // block_size, block_size=block_size)
        return runner, name
    from backends.llamacpp.runner import LlamaCppRunner

    runner = LlamaCppRunner(
        path, max_seqs=max_seqs, kv_tokens=kv_tokens, seq_tokens=seq_tokens,
        kv_layout=kv_layout, block_size=block_size or LLAMACPP_BLOCK_SIZE,
        max_batch_tokens=max_batch_tokens, n_threads=n_threads, flash_attn=flash_attn,
    )
    return runner, name
