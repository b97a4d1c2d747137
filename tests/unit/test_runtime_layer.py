"""The runtime knows nothing above the network: ``runtime/`` imports only ``net``, ``errors``
and itself of nonstop (docs/design/runtime.md).  Computed from the source, imports
inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import nonstop.runtime

ALLOWED = ("nonstop.runtime", "nonstop.net", "nonstop.errors")


def _nonstop_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "nonstop")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] == "nonstop"
        ):
            found.add(node.module)
    return found


def test_runtime_imports_nothing_of_nonstop_above_the_network() -> None:
    folder = Path(nonstop.runtime.__file__).parent
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 8  # the package was found, with its split modules
    wrong = {
        f"{path.name}: {module}"
        for path in files
        for module in _nonstop_imports(path)
        if not any(module == a or module.startswith(a + ".") for a in ALLOWED)
    }
    assert not wrong, sorted(wrong)
