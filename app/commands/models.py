"""`tandem models list | pull NAME | path NAME`: the model store from the command line."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("models", help="list, download and locate known models")
    actions = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    actions.add_parser("list", help="known models, their size and whether they are downloaded")

    pull = actions.add_parser("pull", help="download and verify a model (no-op if verified)")
    pull.add_argument("name", help="registry name, e.g. smollm2-135m-instruct")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")

    path = actions.add_parser("path", help="print a downloaded model's file path")
    path.add_argument("name", help="registry name")

    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from models.errors import ModelStoreError

    try:
        if args.models_command == "list":
            return _list()
        if args.models_command == "pull":
            return _pull(args.name, progress=not args.quiet)
        return _path(args.name)
    except ModelStoreError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1


def _list() -> int:
    from rich.console import Console
    from rich.table import Table

    from models.registry import DEFAULT_MODEL, MODELS
    from models.store import is_present, model_path

    table = Table(box=None, pad_edge=False)
    for column in ("name", "size", "present", "path"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for name, entry in MODELS.items():
        label = f"{name} (default)" if name == DEFAULT_MODEL else name
        present = "yes" if is_present(name) else "no"
        table.add_row(label, f"{entry.size / 1e6:,.0f} MB", present, str(model_path(name)))
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)  # piped: never wrap or cut the paths
    console.print(table)
    return 0


def _pull(name: str, progress: bool) -> int:
    from models.store import pull

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
