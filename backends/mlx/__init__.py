"""MLX backend: mlx-lm model definitions over a paged KV pool (Apple Silicon; CPU on Linux).

Entry point: `backends.mlx.runner.load_mlx_runner`. Importing this package does not import
mlx, so `tandem doctor` and backend selection work where mlx is missing.
"""
