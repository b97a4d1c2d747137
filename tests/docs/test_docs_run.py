"""The code blocks of README.md and docs/ run as written (issue 13: docs that run).

Which blocks run is said by their info string (docs/writing-docs.md):

* ```` ```python ```` — run as a script, in a fresh folder;
* ```` ```sh ```` — run with ``bash -e``, from a fresh folder laid out like a
  clone (``examples/`` copied, ``.venv/bin/python`` and ``.venv/bin/nonstop``
  running the Python that runs the tests), e.g. a local cluster and its client;
* ```` ```python file=PATH ```` — shows the repository file PATH, which must
  equal the block (a ``sh`` block runs it);
* anything else (```` ```text ````, ```` ```python no-run ````, no info string):
  shown only.

The blocks of one document run in order in one folder, each once, and the
README's embedded example twice (it must be re-runnable).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = {"python", "sh"}
FENCE = re.compile(r"^```(.*)$")


@dataclass
class Block:
    document: Path
    line: int
    info: list[str]
    code: str

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    found: list[Block] = []
    lines = document.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, info = i + 1, m.group(1).split()
        i += 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        found.append(Block(document, start, info, "\n".join(lines[start:i]) + "\n"))
        i += 1
    return found


def runs(block: Block) -> bool:
    return bool(block.info) and block.info[0] in RUNNABLE and len(block.info) == 1


def shown_file(block: Block) -> Path | None:
    for word in block.info[1:]:
        if word.startswith("file="):
            return ROOT / word.removeprefix("file=")
    return None


def clone_like(folder: Path) -> None:
    """A folder laid out as a clone after `make`: examples/ and a .venv/bin that works."""
    shutil.copytree(ROOT / "examples", folder / "examples")
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, command in (
        ("python", f'exec "{sys.executable}" "$@"'),
        ("nonstop", f'exec "{sys.executable}" -m nonstop.admin.cli "$@"'),
    ):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{command}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_block(block: Block, folder: Path, index: int) -> None:
    env = child_env()
    env.pop("NONSTOP_DIR", None)
    if block.info[0] == "python":
        script = folder / f"block_{index}.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-c", block.code]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, (
        f"{block.where} failed (exit {done.returncode}):\n{block.code}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )


def stop_local_clusters(folder: Path) -> None:
    """Whatever a failed block left running: `local down` in every local cluster folder."""
    for layout in folder.rglob(".nonstop/local/local.json"):
        subprocess.run(
            [sys.executable, "-m", "nonstop.admin.cli", "local", "down"],
            cwd=layout.parents[2],
            env=child_env(),
            capture_output=True,
            timeout=60,
        )


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_blocks_run(document: Path, tmp_path: Path) -> None:
    todo = [b for b in blocks(document) if runs(b)]
    for block in blocks(document):
        path = shown_file(block)
        if path is not None:
            assert path.exists(), f"{block.where} shows {path}, which does not exist"
            assert block.code == path.read_text(), f"{block.where} differs from {path}"
    if not todo:
        return
    clone_like(tmp_path)
    try:
        for index, block in enumerate(todo):
            run_block(block, tmp_path, index)
            if document.name == "README.md" and index == 0:
                run_block(block, tmp_path, index)  # the embedded example runs again
    finally:
        stop_local_clusters(tmp_path)


def test_readme_has_blocks_that_run() -> None:
    """The convention is in use: the README's examples are run, not only shown."""
    readme = blocks(ROOT / "README.md")
    assert sum(runs(b) for b in readme) >= 2
    assert any(shown_file(b) for b in readme)


def test_info_strings_follow_the_convention() -> None:
    """A block marked python or sh with anything after it must say no-run or file=."""
    for document in DOCUMENTS:
        for block in blocks(document):
            if block.info and block.info[0] in RUNNABLE and len(block.info) > 1:
                extra = block.info[1:]
                assert extra == ["no-run"] or (len(extra) == 1 and extra[0].startswith("file=")), (
                    f"{block.where}: unknown info string {' '.join(block.info)}"
                )


def test_blocks_are_found_as_a_reader_sees_them(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("a\n```python\nprint(1)\n```\n```text\nno\n```\n```sh no-run\nmake\n```\n")
    found = blocks(doc)
    assert [b.info for b in found] == [["python"], ["text"], ["sh", "no-run"]]
    assert [runs(b) for b in found] == [True, False, False]
    assert found[0].code == "print(1)\n"
    assert os.path.basename(found[0].document) == "x.md"
