"""Load a model file onto the chosen backend's runner."""

from __future__ import annotations

from pathlib import Path

from backends.base import Runner, RunnerConfig, shared_pool_tokens

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


FLASH_ATTN_NOT_ON_MLX = ("--flash-attn is for the llamacpp backend; the MLX backend runs "
                         "mlx-lm's own attention")


def load_runner(path: str | Path, *, backend: str | None = None,
                config: RunnerConfig | None = None) -> tuple[Runner, str]:
    """Returns (runner, backend name) for the model file or MLX directory `path`.

    `config.seq_tokens`, `kv_layout` and `flash_attn` are llama.cpp's (see LlamaCppRunner);
    MLX has one paged pool of `kv_tokens`, f16 or q8_0 (MLX 8-bit affine, see MLXRunner) as
    `kv_cache_type` says. `block_size` None means the runner's (llama.cpp 8, MLX 16). Raises
    FileNotFoundError / ValueError (bad model, or q4_0 KV or a `flash_attn` other than auto on
    MLX), ImportError (mlx missing).
    """
    config = config or RunnerConfig()
    name = _choose(backend)
    if name == "mlx":
        if config.exact:
            from backends.llamacpp.exact import NOT_ON_MLX

            raise ValueError(NOT_ON_MLX)
        if config.flash_attn != "auto":
            raise ValueError(FLASH_ATTN_NOT_ON_MLX)
        from backends.mlx.runner import check_kv_cache_type, load_mlx_runner

        check_kv_cache_type(config.kv_cache_type)  # before mlx is imported: mlx may be missing
        from backends.mlx.convert import converted_dir, is_current

        converted = converted_dir(path)  # `tandem models convert --to mlx` output, if current
        if str(path).endswith(".gguf") and is_current(converted, path):
            path = converted
        kv_tokens = config.kv_tokens or shared_pool_tokens(config.seq_tokens)
        block_size = config.block_size or MLX_BLOCK_SIZE
        runner = load_mlx_runner(str(path), max_seqs=config.max_seqs,
                                 num_blocks=kv_tokens // block_size, block_size=block_size,
                                 kv_cache_type=config.kv_cache_type)
        return runner, name
    from backends.llamacpp.runner import BLOCK_SIZE, LlamaCppRunner

    runner = LlamaCppRunner(
        path, max_seqs=config.max_seqs, kv_tokens=config.kv_tokens,
        seq_tokens=config.seq_tokens, kv_layout=config.kv_layout,
        block_size=config.block_size or BLOCK_SIZE, max_batch_tokens=config.max_batch_tokens,
        n_threads=config.n_threads, flash_attn=config.flash_attn,
        repack=config.repack, kv_cache_type=config.kv_cache_type, exact=config.exact,
    )
    return runner, name
