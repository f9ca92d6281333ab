"""Package layering: the engine core is backend-free; `models/` is a leaf."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(package: str) -> dict[str, set[str]]:
    """{file: top-level and function-level imports} for every .py under `package`."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_engine_core_imports_only_itself_backends_base_numpy_and_stdlib():
    """...and the grammar engine and schema validator, in `app/engine/constrain` only."""
    bad = {}
    for path, names in imported_modules("app/engine").items():
        allowed_third_party = {"numpy"}
        if path.startswith("app/engine/constrain/"):
            allowed_third_party |= {"llguidance", "jsonschema"}
        wrong = sorted(
            n for n in names
            if not (n == "app.engine" or n.startswith("app.engine.") or n == "backends.base"
                    or n.split(".")[0] in sys.stdlib_module_names
                    or n.split(".")[0] in allowed_third_party)
        )
        if wrong:
            bad[path] = wrong
    assert bad == {}


@pytest.mark.parametrize("package, forbidden", [("models", "backends"), ("backends", "app")])
def test_lower_packages_do_not_import_higher_ones(package, forbidden):
    bad = {path: sorted(n for n in names if n.split(".")[0] == forbidden)
           for path, names in imported_modules(package).items()}
    assert {p: n for p, n in bad.items() if n} == {}
