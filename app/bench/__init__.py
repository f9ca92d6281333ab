"""Benchmarks: the engine in process, servers over HTTP, raw llama.cpp ceilings, MLX vs mlx-lm.

`stats` holds the summary arithmetic and `load` the in-process request driver that the
benchmarks share; each other module is one benchmark (most runnable with `python -m`).
"""
