"""The ``nonstop`` command line (G1, G2): node life cycle, cluster status, local clusters.

One command group per module: ``node`` (:mod:`nonstop.admin.cmd_node`),
``cluster`` (:mod:`nonstop.admin.cmd_cluster`), ``partition``
(:mod:`nonstop.admin.cmd_partition`), ``config`` (:mod:`nonstop.admin.cmd_config`), ``local``
(:mod:`nonstop.admin.cmd_local`), ``pipeline`` (:mod:`nonstop.admin.pipeline`),
``store`` (:mod:`nonstop.admin.scrub`), ``logs`` (:mod:`nonstop.admin.cmd_logs`),
``user`` (:mod:`nonstop.admin.cmd_user`), ``app`` (:mod:`nonstop.admin.cmd_app`),
``group`` (:mod:`nonstop.admin.cmd_group`).
Every command prints either a human table or, with ``--json``, one JSON
document on stdout; errors are one line on stderr (``nonstop: error: ...``,
:mod:`nonstop.admin.output`), exit code 2 for a usage error and 1 for a
failure, so scripts can rely on both.
"""

from __future__ import annotations

import click

from nonstop.admin.cmd_app import app
from nonstop.admin.cmd_cluster import cluster
from nonstop.admin.cmd_config import config
from nonstop.admin.cmd_group import group
from nonstop.admin.cmd_local import local
from nonstop.admin.cmd_logs import logs
from nonstop.admin.cmd_node import node
from nonstop.admin.cmd_partition import partition
from nonstop.admin.cmd_user import user
from nonstop.admin.output import emit_status, fail
from nonstop.admin.pipeline import pipeline
from nonstop.admin.registered import add_generated
from nonstop.admin.scrub import store


@click.group()
@click.version_option(package_name="nonstop")
def cli() -> None:
    """nonstop: a highly available transactional object store."""


cli.add_command(node)
cli.add_command(cluster)
cli.add_command(local)
cli.add_command(partition)  # the partition table (nonstop.admin.cmd_partition)
cli.add_command(config)  # versioned configuration (nonstop.admin.cmd_config)
cli.add_command(pipeline)  # the Spark jobs
cli.add_command(store)  # nonstop store verify (nonstop.admin.scrub)
cli.add_command(logs)  # the merged node logs
cli.add_command(user)  # users and roles (nonstop.admin.cmd_user)
cli.add_command(app)  # application commands (nonstop.admin.cmd_app)
cli.add_command(group)  # one command on every node of a group (nonstop.admin.cmd_group)
# Registered commands with no hand-written CLI command (nonstop.commands): generated ones.
add_generated(cli)


def main() -> None:
    """Console-script entry point (also ``python -m nonstop``)."""
    cli(prog_name="nonstop")


__all__ = ["cli", "emit_status", "fail", "main"]

if __name__ == "__main__":
    main()
