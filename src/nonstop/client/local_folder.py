"""Finding the local cluster of the current folder: ``nonstop.connect()`` with no address.

``nonstop local up`` keeps its layout in ``./.nonstop/local/local.json`` (see
:mod:`nonstop.admin.local`, which writes it).  Reading it here, below the admin
layer, lets a client started in the same folder connect without copying the
ports that ``local up`` picked.  Only the file's ``nodes[].listen`` entries and
the ``cluster`` id are read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from nonstop.errors import Unavailable

# The folder ``nonstop local up`` uses by default, relative to where it runs.
LOCAL_CLUSTER_DIR = Path(".nonstop") / "local"

log = logging.getLogger("nonstop.client")


def local_cluster_addresses(folder: str | Path | None = None) -> list[str]:
    """The node addresses of the local cluster in ``folder`` (default: the current one's).

    Raises :class:`~nonstop.errors.Unavailable` naming the file and the fix when
    there is no local cluster there.
    """
    base = Path.cwd() / LOCAL_CLUSTER_DIR if folder is None else Path(folder)
    layout_path = base / "local.json"
    try:
        layout = json.loads(layout_path.read_text())
        addresses = [str(node["listen"]) for node in layout["nodes"]]
    except FileNotFoundError:
        raise Unavailable(
            f"no address given and no local cluster in {base} "
            "(run `nonstop local up` there, or pass addresses: nonstop.connect('host:port,...'))"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Unavailable(f"cannot read the local cluster layout {layout_path}: {exc}") from None
    if not addresses:
        raise Unavailable(f"the local cluster layout {layout_path} lists no node")
    log.info(
        "connecting to local cluster %s of %s: %s",
        layout.get("cluster", "?"),
        base,
        ",".join(addresses),
    )
    return addresses
