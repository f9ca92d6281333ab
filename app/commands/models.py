"""`tandem models list | pull NAME | path NAME | convert NAME --to mlx`: the model store."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models", help="list, download and locate known models",
        description="The model registry: list the known models with their size and whether "
        "they are downloaded, pull (download and verify) one, print a downloaded model's path, "
        "or convert a GGUF model for the MLX backend.")
    actions = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    actions.add_parser("list", help="known models, their size and whether they are downloaded")

    pull = actions.add_parser("pull", help="download and verify a model (no-op if verified)")
    pull.add_argument("name", help="registry name (e.g. smollm2-135m-instruct) or a Hugging "
                      "Face file, owner/repo/file.gguf (through the huggingface-hub cache; "
                      "HF_HUB_OFFLINE=1 uses the cache only)")
    pull.add_argument("--quiet", action="store_true", help="no progress bar (default: shown)")

    path = actions.add_parser("path", help="print a downloaded model's file path")
    path.add_argument("name", help="registry name")

    convert = actions.add_parser("convert", help="convert a GGUF model for another backend")
    convert.add_argument("name", help="registry name or path to a .gguf")
    convert.add_argument("--to", choices=["mlx"], required=True, help="target format")
    convert.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                         default="float16", help="weight dtype of the converted model "
                         "(default: float16)")
    convert.add_argument("--quantize-bits", type=int, choices=[4, 8], default=None,
                         help="requantize to MLX's affine format, bits per weight (lossy; "
                         "default: keep --dtype)")

    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from models.errors import ModelStoreError

    try:
        if args.models_command == "list":
            return _list()
        if args.models_command == "pull":
            return _pull(args.name, progress=not args.quiet)
        if args.models_command == "convert":
            return _convert(args)
        return _path(args.name)
    except (ModelStoreError, FileNotFoundError, ValueError, ImportError) as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1


def _convert(args: argparse.Namespace) -> int:
    from backends.mlx.convert import convert_gguf_to_mlx
    from models.store import resolve_model

    out = convert_gguf_to_mlx(resolve_model(args.name), dtype=args.dtype,
                              quantize_bits=args.quantize_bits)
    print(out)
    return 0


def _list() -> int:
    from rich.console import Console
    from rich.table import Table

    from models.registry import DEFAULT_MODEL, LLAMA_CPP_DEFAULTS, MODELS
    from models.store import is_present, mlx_conversions, model_path

    table = Table(box=None, pad_edge=False)
    for column in ("name", "size", "present", "sampling defaults", "path"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for name, entry in MODELS.items():
        label = f"{name} (default)" if name == DEFAULT_MODEL else name
        present = "yes" if is_present(name) else "no"
        table.add_row(label, f"{entry.size / 1e6:,.0f} MB", present, entry.defaults.describe(),
                      str(model_path(name)))
    for conv in mlx_conversions():  # `tandem models convert --to mlx` output
        size = sum(f.stat().st_size for f in conv.iterdir() if f.is_file())
        table.add_row(f"{conv.name} (MLX)", f"{size / 1e6:,.0f} MB", "yes",
                      LLAMA_CPP_DEFAULTS.describe(), str(conv))
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)  # piped: never wrap or cut the paths
    console.print(table)
    return 0


def _pull(name: str, progress: bool) -> int:
    from pathlib import Path

    from models.errors import ModelNotFoundError
    from models.registry import MODELS
    from models.store import hf_spec, pull, pull_hf

    if hf_spec(name) is not None and not Path(name).expanduser().exists():
        print(pull_hf(name))
        return 0
    if name not in MODELS:
        if Path(name).expanduser().exists():
            raise ModelNotFoundError(f"{name} is a local path: nothing to pull; use it as is "
                                     f"(tandem run --model {name} ...)")
        raise ModelNotFoundError(f"unknown model '{name}'; known models: {', '.join(MODELS)} "
                                 "(or a Hugging Face file: owner/repo/file.gguf)")
    print(pull(name, progress=progress))
    return 0


def _path(name: str) -> int:
    from models.store import is_present, model_path

    path = model_path(name)  # raises for unknown names
    if not is_present(name):
        hint = f"run: tandem models pull {name}"
        print(f"tandem: model '{name}' is not downloaded; {hint}", file=sys.stderr)
        return 1
    print(path)
    return 0
