"""The node process: open the data directory, run the runtime until SIGTERM.

``nonstop node start`` lands here (in the foreground, or in a detached child).
Start-up order follows the seed's distribution life cycle (000 ch. 6): check the
data directory and identity, open the stores, start the network listener, then
hand the machine its ``Started`` event; only then is the pid file written, so a
pid file always means "this node is listening".

Every start-up failure is one line on stderr and exit code 1 (2 for a bad
configuration): a port in use, a data directory of another cluster or node, a
data directory already used by a running node, a node name already used in the
cluster, a data directory that cannot take writes (read-only, full), a damaged
store (the structure and checksum walk of ``DataDir.verify``, bounded in time:
the node refuses to serve a store that fails it, or, routing by partition with
replication, rebuilds a damaged object store from the partitions' copies:
``node/store_repair.py``).  While it runs, a background scrub (``scrub_interval``
seconds, default an hour) verifies both stores in full and stops the node, with
that one line, if either is damaged; so does a record that fails its checksum
when a transaction reads it (the line is kept in ``DATA/store/DAMAGED`` for the
next start).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nonstop.errors import BadArgument, SchemaError, StoreError
from nonstop.net.handshake import ROLE_NODE, Hello
from nonstop.net.tls import TLSSetupError
from nonstop.node import log_format
from nonstop.node.access import NodeAccess, cluster_caught_up
from nonstop.node.config import ConfigError, NodeConfig, split_join
from nonstop.node.datadir import DataDir, Identity
from nonstop.node.machine import NodeContext, resolve, takes_context, users_table
from nonstop.node.router import NodeRouter, OpPermissions
from nonstop.node.startup_heap import freeze_startup_objects
from nonstop.node.store_repair import check_data_dir
from nonstop.runtime.real import (
    RealRuntime,
    RuntimeConfig,
    install_event_loop_policy,
    new_rng,
)
from nonstop.store.records import on_corrupt

if TYPE_CHECKING:
    from nonstop.adminapi.server import AdminServer
    from nonstop.node.metrics_http import MetricsServer

log = logging.getLogger("nonstop.node")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2


class NodeStartError(Exception):
    """The node cannot start; the message is the one line the operator sees."""


def setup_logging(cfg: NodeConfig) -> None:
    """One event per line: JSON objects (``log_format = "json"``, the default, read by
    ``nonstop logs``) or plain text (:mod:`nonstop.node.log_format`)."""
    handler: logging.Handler
    if cfg.log_file:
        handler = logging.FileHandler(cfg.log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_format.formatter(cfg.log_format, cfg.name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, cfg.log_level.upper(), logging.INFO))


async def start_metrics(runtime: RealRuntime, cfg: NodeConfig) -> MetricsServer | None:
    """Serve the node's Prometheus metrics on ``metrics.listen`` (None: not configured)."""
    if cfg.metrics.listen is None:
        return None
    from nonstop.node.admin_http import metrics_gate
    from nonstop.node.metrics import attach, node_registry
    from nonstop.node.metrics_http import serve_metrics

    observer = attach(runtime, cfg.metrics.latency_buckets)
    gate = metrics_gate(runtime, cfg)
    try:
        cert = (cfg.tls.cert, cfg.tls.key) if cfg.tls.cert and cfg.tls.key else None
        registry = node_registry(runtime, observer)
        return await serve_metrics(registry, cfg.metrics.listen, gate, cert)
    except OSError as exc:
        reason = "port in use" if exc.errno == errno.EADDRINUSE else str(exc)
        where = cfg.metrics.listen
        raise NodeStartError(f"cannot listen for metrics on {where}: {reason}") from exc


async def start_admin_api(
    runtime: RealRuntime, cfg: NodeConfig, cluster: str
) -> AdminServer | None:
    """Serve the admin API and console on ``admin.listen`` (None: not configured)."""
    if cfg.admin.listen is None:
        return None
    from nonstop.node.admin_http import start_admin

    try:
        return await start_admin(runtime, cfg, cluster)
    except OSError as exc:
        reason = "port in use" if exc.errno == errno.EADDRINUSE else str(exc)
        raise NodeStartError(
            f"cannot listen for the admin API on {cfg.admin.listen}: {reason}"
        ) from exc


def open_object_store(
    datadir: DataDir, ident: Identity | None = None, *, hold_async: bool = False
) -> Any:
    """Open ``DATA/store`` with ``nonstop.open`` when the store layer provides it.

    A new store takes the node's location code (C1), so the references it makes
    name this node: that is how every node finds an object's master from its
    reference (data-path.md section 5).  An existing store keeps its own.
    ``hold_async``: run no queued call until the node attaches its gate (partitions
    that replicate: a call runs on its partition's active node only).
    """
    import nonstop

    opener = getattr(nonstop, "open", None)
    if opener is None:
        return None
    try:
        if ident is not None:
            from nonstop.store.lmdb_store import Store

            Store(datadir.store_path, location=ident.location).close()
        db = (
            opener(str(datadir.store_path), hold_async=True)
            if hold_async
            else opener(str(datadir.store_path))
        )
    except Exception as exc:
        raise NodeStartError(f"cannot open the object store {datadir.store_path}: {exc}") from exc
    if ident is not None and db.location != ident.location:
        log.warning(
            "the object store's location %016x is not the node's %016x (store made before "
            "this node had its identity); its objects are found through the store's code",
            db.location,
            ident.location,
        )
    return db


def load_app_modules(cfg: NodeConfig) -> list[Any]:
    """Import the application modules (F2) before the store opens; one-line error."""
    from nonstop.node.apps import AppLoadError, load_apps

    try:
        modules = load_apps(cfg.app)
    except AppLoadError as exc:
        raise NodeStartError(str(exc)) from exc
    if modules:
        log.info("application modules: %s", ", ".join(m.__name__ for m in modules))
    return modules


COMPONENT_WAIT = 60.0
"""Seconds a starting node waits for quorum to activate its components' configuration."""


async def activate_components(
    runtime: RealRuntime, modules: list[Any], failed: Callable[[str], None]
) -> list[Any]:
    """Activate the application modules as components (F2, ``nonstop.node.apps``).

    The hooks in order, then every component's configuration in one change of
    the configuration table, retried until the cluster has quorum.  A failure
    undoes the hooks, logs why and calls ``failed`` with one line (the node
    stops).  Returns the components activated, for :func:`stop_components` at stop.
    """
    from nonstop.node.apps import (
        ComponentError,
        component_ops,
        components_of,
        start_components,
        stop_components,
    )

    try:
        components = components_of(modules)
        ops = component_ops(components)  # every file checked before any hook runs
        started = start_components(components)
    except ComponentError as exc:
        log.error("component activation failed, nothing activated: %s", exc)
        failed(str(exc))
        return []
    if not ops:
        return started
    names = ", ".join(c.name for c in components if c.files)
    payload = {"op": "config", "do": "apply", "ops": ops, "label": f"components {names}"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + COMPONENT_WAIT
    reply: Any = None
    while loop.time() < deadline:
        reply = await runtime.submit(payload)
        # No quorum yet, not applied in time, or overtaken by another change: ask again.
        message = str(reply.get("message")) if isinstance(reply, dict) else ""
        retry = isinstance(reply, dict) and (
            reply.get("error") == "Timeout" or "has no quorum" in message or "try again" in message
        )
        if not retry:
            break
        await asyncio.sleep(0.5)
    if isinstance(reply, dict) and reply.get("ok"):
        log.info(
            "components activated: %s (%d configuration changes)", names, len(reply["changes"])
        )
        return started
    reason = reply.get("message") if isinstance(reply, dict) else reply
    stop_components(started)
    message = f"component activation rolled back, nothing activated: {reason}"
    log.error("%s", message)
    failed(message)
    return []


async def serve(cfg: NodeConfig, datadir: DataDir) -> None:
    """Run until SIGTERM/SIGINT (graceful) or a fatal identity error."""
    modules = load_app_modules(cfg)
    store, ident = datadir.open_identity(cfg)
    object_store = None
    try:
        object_store = open_object_store(datadir, ident, hold_async=cfg.ha.replicating)
        runtime = make_runtime(cfg, store, ident, object_store)
        attach_app_commands(runtime, cfg, ident.cluster)
        install_node_notifiers(runtime)
        failure: list[str] = []
        stop = asyncio.Event()

        def identity_error(exc: Exception) -> None:
            failure.append(str(exc))
            stop.set()

        runtime.on_identity_error = identity_error
        try:
            await runtime.start()
        except TLSSetupError as exc:
            raise NodeStartError(str(exc)) from None
        except OSError as exc:
            reason = "port in use" if exc.errno == errno.EADDRINUSE else str(exc)
            raise NodeStartError(f"cannot listen on {cfg.listen}: {reason}") from exc
        except (ConfigError, NodeStartError):
            raise
        except Exception as exc:
            log.exception("cannot start the cluster machine")
            raise NodeStartError(f"cannot start the cluster machine: {exc!r}") from exc
        try:
            metrics = await start_metrics(runtime, cfg)
        except NodeStartError:
            await runtime.stop()
            raise
        try:
            admin = await start_admin_api(runtime, cfg, ident.cluster)
        except NodeStartError:
            if metrics is not None:
                await metrics.stop()
            await runtime.stop()
            raise
        await runtime.first_contacts(cfg.connect_timeout + 0.5)
        if failure:
            if admin is not None:
                await admin.stop()
            if metrics is not None:
                await metrics.stop()
            await runtime.stop()
            raise NodeStartError(f"refused by the cluster: {failure[0]}")
        datadir.write_pid(cfg.listen)
        datadir.save_config(cfg)
        log.info(
            "node %s of cluster %s listening on %s (pid %d, location %d, protocol %d..%d)",
            ident.name,
            ident.cluster,
            cfg.listen,
            os.getpid(),
            ident.location,
            cfg.protocol[0],
            cfg.protocol[1],
        )
        frozen = freeze_startup_objects()
        log.debug("start-up objects kept out of garbage collection: %d", frozen)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        joiner = None
        if not cfg.members and cfg.join:
            joiner = asyncio.ensure_future(auto_join(runtime, cfg))
        damaged: list[str] = []
        component_failure: list[str] = []

        def component_failed(message: str) -> None:
            component_failure.append(message)
            stop.set()

        components = asyncio.ensure_future(activate_components(runtime, modules, component_failed))

        def store_damaged(problem: str) -> None:
            damaged.append(problem)
            datadir.mark_damage(problem)  # the next start treats the store as damaged
            stop.set()

        scrubber = asyncio.ensure_future(
            background_scrub(datadir, cfg.scrub_interval, store_damaged)
        )

        # A record that fails its checksum when read (any thread): stop serving the store.
        def record_damaged(err: Exception) -> None:
            loop.call_soon_threadsafe(store_damaged, str(err))

        stop_listening = on_corrupt(record_damaged)
        stopped = asyncio.ensure_future(runtime.stopped.wait())
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait({stopped, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopped.cancel()
        if joiner is not None:
            joiner.cancel()
        scrubber.cancel()
        stop_listening()
        log.info("node %s stopping", ident.name)
        await stop_activated(components)
        if admin is not None:
            await admin.stop()
        if metrics is not None:
            await metrics.stop()
        await runtime.stop()
        datadir.remove_pid()
        if failure:
            raise NodeStartError(f"refused by the cluster: {failure[0]}")
        if runtime.fatal is not None:
            raise NodeStartError(f"cluster state commit failed: {runtime.fatal}")
        if damaged:
            raise NodeStartError(f"damaged store, stopped serving it: {damaged[0]}")
        if component_failure:
            raise NodeStartError(component_failure[0])
        log.info("node %s stopped", ident.name)
    finally:
        if object_store is not None:
            with contextlib.suppress(Exception):
                object_store.close()
        store.close()
        datadir.remove_pid()


async def stop_activated(activation: asyncio.Future[list[Any]]) -> None:
    """Deactivate the components activated at start, in reverse order (F2)."""
    from nonstop.node.apps import stop_components

    if not activation.done():
        activation.cancel()
        return
    if activation.cancelled() or activation.exception() is not None:
        return
    for failure in stop_components(activation.result()):
        log.warning("%s", failure)


async def background_scrub(
    datadir: DataDir, interval: float, damaged: Callable[[str], None]
) -> None:
    """Every ``interval`` seconds, verify both stores in full (structure and checksums) in a
    child process at low priority; on damage, log it and call ``damaged`` with the one line
    (the node then stops: it would refuse to start on that store anyway)."""
    if interval <= 0:
        return
    while True:
        await asyncio.sleep(interval)
        paths = [str(p) for p in (datadir.cluster_path, datadir.store_path) if p.is_dir()]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nonstop.store.verify",
            *paths,
            "--nice",
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            out, _ = await proc.communicate()
        except asyncio.CancelledError:  # the node stops: do not leave the child behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        try:
            reports = json.loads(out)
        except ValueError:
            log.warning("background scrub failed (exit status %s)", proc.returncode)
            continue
        problems = [p for r in reports for p in r["problems"]]
        if problems:
            log.error("background scrub: %s", problems[0])
            damaged(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            return
        log.info(
            "background scrub: %d records of %d databases intact",
            sum(r["records"] for r in reports),
            sum(r["databases"] for r in reports),
        )


def install_node_notifiers(runtime: RealRuntime) -> None:
    """Feed ``node_state`` notifications to the C3 notifier registry (serialized per node).

    Notifiers registered on ``runtime.node_notifiers`` run on the event loop,
    after the machine's actions; they must be quick (hand long work to a task).
    """
    try:
        from nonstop.cluster.failure import NotifierRegistry
    except ImportError:  # the cluster layer is optional for the runtime
        return
    registry = NotifierRegistry()
    runtime.node_notifiers = registry  # type: ignore[attr-defined]

    def on_node_state(action: Any) -> None:
        registry.on_notify(action.data)
        registry.run_pending()

    runtime.add_notifier("node_state", on_node_state)


async def auto_join(runtime: RealRuntime, cfg: NodeConfig) -> None:
    """A node started without a bootstrap membership asks the cluster to add it.

    It sends ``{"op": "join"}`` through its ``--join`` addresses (any node
    forwards it to the leader) until the committed membership contains it;
    a node that is already a member (a restart) sends nothing.
    """
    from nonstop.client.handle import AsyncClient

    plain, named = split_join(cfg.join)
    addresses = plain + list(named.values())
    delay = 0.2
    last_error = ""
    while True:
        members = getattr(runtime.machine, "view_members", None)
        if members is None:
            members = getattr(runtime.machine, "members", None)
        if members is not None and cfg.name in members:
            log.info("node %s is a member of the cluster", cfg.name)
            return
        try:
            async with AsyncClient(
                addresses,
                cluster=runtime.hello.cluster,
                timeout=5.0,
                rounds=1,
                tls=cfg.tls.runtime(),
                protocol=(cfg.protocol[0], cfg.protocol[1]),
                # A joiner proves the cluster secret, like a member: `join` is not a user's.
                credentials=runtime.transport.node_key,
            ) as client:
                reply = await client.request(
                    {"op": "join", "name": cfg.name, "address": cfg.listen}
                )
            if isinstance(reply, dict) and reply.get("ok"):
                log.info("joined the cluster: view %s", reply.get("view"))
            elif isinstance(reply, dict) and "error" in reply:
                raise RuntimeError(f"{reply.get('error')}: {reply.get('message')}")
        except Exception as exc:
            if str(exc) != last_error:
                log.info("join not done yet: %s", exc)
                last_error = str(exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def make_runtime(
    cfg: NodeConfig, store: Any, ident: Identity, object_store: Any = None
) -> RealRuntime:
    """The runtime of this node, composed with its services.

    The composition, not the runtime, decides where things go: the node's
    :class:`~nonstop.node.router.NodeRouter` takes the data path's client ops and
    peer messages (to the data service when there is an object store), and the
    machine factory routes the durable keys it does not keep in the cluster
    store (the distributed-commit machine's ``dtx/`` keys) to their persister on
    ``runtime.persists``.
    """
    factory = resolve(cfg.machine)
    plain, static_peers = split_join(cfg.join)
    hello = Hello(
        cluster=ident.cluster,
        name=ident.name,
        location=ident.location,
        timestamp=ident.timestamp,
        proto_min=cfg.protocol[0],
        proto_max=cfg.protocol[1],
        role=ROLE_NODE,
        address=cfg.listen,
        pid=os.getpid(),
    )
    rng = new_rng()
    context = NodeContext(db=object_store)
    access = NodeAccess.from_config(cfg)

    def machine_factory(recovered: dict[bytes, bytes]) -> Any:
        if not takes_context(factory):
            return factory(cfg, ident, recovered, rng)
        return factory(cfg, ident, recovered, rng, context=context)

    runtime = RealRuntime(
        hello=hello,
        store=store,
        machine_factory=machine_factory,
        config=RuntimeConfig(
            listen=cfg.listen,
            join=plain,
            static_peers=static_peers,
            max_frame=cfg.max_frame_bytes,
            tls=cfg.tls.runtime(),
            discovery=cfg.discovery.runtime(),
            connect_timeout=cfg.connect_timeout,
            limits=cfg.limits.runtime(),
            # Half the detector's timeout: a loop blocked that long is half way to
            # making this node look Down to its peers.
            loop_lag_warn=cfg.nonresponse_timeout / 2,
            guard=access.guard(
                lambda: users_table(runtime.machine),
                lambda: cluster_caught_up(runtime.machine),
            ),
        ),
    )
    if access.enabled:
        runtime.permissions = OpPermissions(
            runtime.name, access.roles_lookup(lambda: users_table(runtime.machine))
        )
    context.route_persists = runtime.persists.route
    context.cluster_writer = runtime.writer
    service = None
    if object_store is not None:
        service = attach_data_service(runtime, object_store, cfg, context)
    runtime.router = NodeRouter(runtime.name, service, object_store)
    return runtime


def attach_app_commands(runtime: RealRuntime, cfg: NodeConfig, cluster: str) -> None:
    """Serve the application commands of the node's modules (``nonstop.node.app_commands``):
    each runs in a transaction opened through the node's own address."""
    from nonstop.client import AsyncClient, Client
    from nonstop.node.admin_http import self_client_options
    from nonstop.node.app_commands import AppCommandService

    access = NodeAccess.from_config(cfg)
    options = self_client_options(cfg, access)

    def opener() -> Client:
        return Client([cfg.listen], cluster=cluster, timeout=10.0, **options)

    def async_opener() -> AsyncClient:  # an async def command's, on the node's loop
        return AsyncClient([cfg.listen], cluster=cluster, timeout=10.0, **options)

    roles_of = access.roles_lookup(lambda: users_table(runtime.machine)) if access.enabled else None
    router = runtime.router
    assert isinstance(router, NodeRouter), router
    router.applications = AppCommandService(
        runtime.name, opener, roles_of, async_opener=async_opener
    )


def attach_data_service(runtime: RealRuntime, db: Any, cfg: NodeConfig, context: Any) -> Any:
    """The node's data service (``nonstop.dataplane.service``) and its hooks into the machine."""
    import dataclasses

    from nonstop.dataplane.service import DataService, ServiceConfig

    names = {f.name for f in dataclasses.fields(ServiceConfig)}
    config = ServiceConfig(**{k: v for k, v in cfg.extra.items() if k in names})
    service = DataService(runtime, db, config)
    if cfg.ha.data == "partitions":
        route_by_partition(service, cfg)
    if cfg.ha.replicating:
        replicate_partitions(runtime, service, context)

    def feed(progress: list[Any]) -> None:
        # A message from the node to itself: delivered on the next loop turn,
        # never inside the machine's own handle().
        runtime.send(runtime.name, {"t": "dtx.rm", "p": progress})

    context.lookup_branch = service.lookup_branch
    context.branch_lapsed = service.branch_lapsed
    context.feed = feed
    return service


def replicate_partitions(runtime: RealRuntime, service: Any, context: Any) -> None:
    """Sync replication of partitions (replication.md §10c): commits wait for the replicas
    (``replica_store.replicated_commit``), the machine is woken when the store queued a
    call for it, and the data plane acts for a partition only once the store took its copy
    (``ReplicatedClusterNode.ready``)."""
    from nonstop.node.replica_store import replicated_commit
    from nonstop.node.replicated import WAKE, StoreSide

    side = StoreSide()
    side.wake = lambda: runtime.send(runtime.name, {"t": WAKE})
    context.replicator = side

    async def commit(tx: Any) -> dict[str, Any] | None:
        return await replicated_commit(tx, side.commit)

    service.commit = commit
    run_calls_where_partitions_are(runtime, service.db, side)
    refuse_unreplicated_bulk_writes(service)
    cluster_acting = service.acting

    def acting(now: float, partition: str) -> bool:
        ready = getattr(runtime.machine, "ready", None)
        return bool(cluster_acting(now, partition) and (ready is None or ready(partition)))

    service.machine.config.acting = acting


def run_calls_where_partitions_are(runtime: RealRuntime, db: Any, side: Any) -> None:
    """Queued asynchronous calls and timers run on their partition's active node, their
    runs replicated (``nonstop.node.replicated_calls``); the store was opened holding them
    (``open_object_store(hold_async=True)``) until now."""
    from nonstop.node.replicated_calls import ReplicatedCallGate

    gate = ReplicatedCallGate(
        db.engine.dispatcher,
        lambda: runtime.machine,
        side.commit,
        runtime.now,
        asyncio.get_running_loop(),
    )
    gate.start()


BULK_WRITES = frozenset({"bulk.upsert", "bulk.stream.commit", "bulk.overwrite.commit"})
"""Bulk ops that write the store's objects directly, outside the replication machine.
(``bulk.overwrite.begin``/``part`` only stage rows as invisible local records: the
swap that makes them objects is a replicated transaction, data-path.md §6.6.)"""


def refuse_unreplicated_bulk_writes(service: Any) -> None:
    """A replicating node refuses bulk writes (Spark loads): they bypass the replication
    machine, so a failover -- or this node's own restart, which reloads each partition
    from the machine's copy -- would lose them (replication.md §10d).  Reads stay."""
    bulk = service._bulk

    async def guarded(op: str, payload: dict[str, Any]) -> dict[str, Any]:
        if op in BULK_WRITES:
            raise BadArgument(
                f"{op}: bulk writes are not replicated yet; on a cluster that replicates "
                "its partitions, write through transactions (or set ha.replicate_data = false "
                "with replicas = 0)"
            )
        result: dict[str, Any] = await bulk(op, payload)
        return result

    service._bulk = guarded


def route_by_partition(service: Any, cfg: NodeConfig) -> None:
    """``ha.data = "partitions"``: the data plane routes by partition (ha.md "Routing by
    partition").  Every managed type's binding is checked here, after the application
    modules are loaded: one that could put one unique value in two partitions stops the
    start with one line naming the type (``tx/unique_scope.py``)."""
    from nonstop.dataplane.placement import BindingPlacement
    from nonstop.ha.policies import DistributionError
    from nonstop.model.managed import registered_types, type_info

    try:
        placement = BindingPlacement(cfg.ha.distribution(cfg.members or None))
        placement.check_bindings(type_info(cls) for cls in registered_types().values())
    except (DistributionError, SchemaError) as exc:
        raise ConfigError(f"config key 'ha': {exc}") from None
    service.machine.config.placement = placement
    service.machine.config.acting = service.acting
    service.machine.config.applied_epoch = service.applied_epoch


def run(cfg: NodeConfig) -> int:
    """Run a node in this process; returns the exit code."""
    try:
        cfg.validate()
    except ConfigError as exc:
        print(f"nonstop: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    datadir = DataDir(cfg.data)
    pid = datadir.running_pid()
    if pid is not None and pid != os.getpid():
        print(
            f"nonstop: error: data directory {datadir.path} is in use by a running node "
            f"(pid {pid})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        datadir.path.mkdir(parents=True, exist_ok=True)
        if cfg.log_file:
            os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
        setup_logging(cfg)
    except OSError as exc:
        print(f"nonstop: error: cannot create {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    problem = check_data_dir(
        datadir, repairable=cfg.ha.replicating and cfg.ha.repair_store, node=cfg.name
    )
    if problem is not None:
        if cfg.log_file:  # else the log is stderr: the line below says it once
            log.error("%s", problem)
        print(f"nonstop: error: {problem}", file=sys.stderr)
        return EXIT_ERROR
    install_event_loop_policy()
    try:
        asyncio.run(serve(cfg, datadir))
    except (ConfigError, NodeStartError, StoreError) as exc:
        if cfg.log_file:  # else the log is stderr: the line below says it once
            log.error("%s", exc)
        print(f"nonstop: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
