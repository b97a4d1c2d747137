"""The web console lists partitions in their natural order: ``default.2`` before ``default.10``.

The order lives in ``console/order.js`` (loaded by the page before ``console.js``);
this test runs it under node, without a browser.  The console's browser test
(tests/cluster/test_console_browser.py) checks the rows of a live cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources

import pytest

NODE = shutil.which("node") or shutil.which("nodejs")
ORDER_JS = resources.files("nonstop.adminapi") / "console" / "order.js"

pytestmark = pytest.mark.skipif(NODE is None, reason="needs node (Debian's nodejs) to run the JS")


def console_order(names: list[str]) -> list[str]:
    script = (
        f"const {{ byPartitionName }} = require({json.dumps(str(ORDER_JS))});\n"
        f"const names = {json.dumps(names)};\n"
        "const rows = byPartitionName(names.map(name => ({ name })));\n"
        "console.log(JSON.stringify(rows.map(p => p.name)));"
    )
    done = subprocess.run(
        [str(NODE), "-e", script], capture_output=True, text=True, timeout=30, check=True
    )
    ordered: list[str] = json.loads(done.stdout)
    return ordered


def test_partitions_sort_by_their_index_not_as_text() -> None:
    names = [f"default.{i}" for i in (10, 1, 15, 0, 2, 11, 9)] + ["S", "pinned.3", "pinned.12"]
    assert console_order(names) == [
        "S",
        "default.0",
        "default.1",
        "default.2",
        "default.9",
        "default.10",
        "default.11",
        "default.15",
        "pinned.3",
        "pinned.12",
    ]


def test_the_console_orders_as_partition_list_does() -> None:
    from nonstop.commands.partition_commands import natural_key

    names = ["b.2", "a.10", "a.9", "a10", "a9", "a.1.10", "a.1.9", "Z.1", "a.01", "a.1"]
    assert console_order(names) == sorted(names, key=natural_key)


def test_the_page_loads_the_order_before_the_console() -> None:
    page = (resources.files("nonstop.adminapi") / "console" / "index.html").read_text()
    assert page.index('src="order.js"') < page.index('src="console.js"')
    script = (resources.files("nonstop.adminapi") / "console" / "console.js").read_text()
    assert "byPartitionName(s.partitions" in script
