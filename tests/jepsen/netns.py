"""A private network of namespaces, and the faults the harness puts into it.

One :class:`Network` is one bridge on the host and one network namespace per
node, each joined to the bridge by a veth pair, with addresses in a private
``/24`` (``10.77.X.0/24``: the host's end of the bridge is ``.1``, nodes are
``.2``, ``.3``, ...).  Namespaces get no default route, so nothing they send
can leave the bridge.

Faults are rules in each namespace's own nftables table (``inet jepsen``, an
``output`` hook): a packet from A to B is dropped in A's namespace, so a
one-way cut A→B is one rule in A, a cut both ways one rule on each side, and
random loss a ``numgen random`` rule.  The whole table is rewritten in one
nftables transaction on every change, from the fault state kept here, so a
heal can never leave a stray rule.  Delay uses the kernel's ``netem`` qdisc
where it has one (:func:`netem_available`); where it is missing (the CI VM's
kernel has no ``sch_netem``) a network made with ``relay_port`` delays through a
relay in every namespace (:mod:`tests.jepsen.relay`: the node's connections to its
peers' ``relay_port`` are redirected to it, and it delays the bytes as told), and
one made without raises :class:`Unsupported`.

Names carry the owner's pid (``njp<pid><n>-<node>``, bridge ``njb<pid><n>``,
host veth ends ``njv<pid><n><i>``), so parallel runs never collide and
:func:`clean_stale` removes what a dead owner left behind (its namespaces,
the processes still in them, its bridge and veths).  :meth:`Network.down`
runs from ``finally`` blocks and is idempotent.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.jepsen.relay import MARK

NS_PREFIX = "njp"
BRIDGE_PREFIX = "njb"
VETH_PREFIX = "njv"
SUBNET_BASE = "10.77"
HOST = "host"
"""The peer name of the host's end of the bridge (where the clients run)."""

RELAY_BASE = 17100
"""A namespace's relay listens for peer number ``i`` on 127.0.0.1:``RELAY_BASE + i``."""
ROOT = Path(__file__).resolve().parents[2]

_runs = itertools.count()
_NAME = re.compile(rf"^(?:{NS_PREFIX}|{BRIDGE_PREFIX}|{VETH_PREFIX})([0-9a-f]{{6}})")


class Unsupported(RuntimeError):
    """The kernel or the tools here cannot make this fault."""


def _run(args: Sequence[str], stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        list(args), input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be used here (one line), or None if they can."""
    if os.geteuid() != 0:
        return "the netns harness needs root (ip netns, veth, a bridge)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian package {package})"
    probe = f"{NS_PREFIX}{os.getpid():06x}probe"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "nft", "-f", "-"], stdin=_ruleset([]))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a network namespace with nftables here: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


_netem: bool | None = None


def netem_available() -> bool:
    """Whether the kernel has the ``netem`` qdisc (delay, jitter); probed once."""
    global _netem
    if _netem is None:
        probe = f"{NS_PREFIX}{os.getpid():06x}netem"
        try:
            _run(["ip", "netns", "add", probe])
            proc = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    probe,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "lo",
                    "root",
                    "netem",
                    "delay",
                    "1ms",
                ],
                capture_output=True,
                timeout=30,
                check=False,
            )
            _netem = proc.returncode == 0
        except (RuntimeError, OSError, subprocess.SubprocessError):
            _netem = False
        finally:
            _run(["ip", "netns", "del", probe], check=False)
    return _netem


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> list[str]:
    """Remove namespaces, bridges and veths of this harness whose owner is dead."""
    removed: list[str] = []
    for ns in _run(["ip", "netns", "list"], check=False).split():
        m = _NAME.match(ns)
        if m and not _pid_alive(int(m.group(1), 16)):
            _kill_namespace_processes(ns)
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    for line in _run(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _NAME.match(name)
        if m and not name.startswith(NS_PREFIX) and not _pid_alive(int(m.group(1), 16)):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


def _kill_namespace_processes(ns: str) -> None:
    for pid in _run(["ip", "netns", "pids", ns], check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


def _ruleset(rules: Iterable[str], redirects: Iterable[str] = ()) -> str:
    """One nftables transaction: make sure the table exists, drop it, write it anew
    (``redirects``: the relay's ``nat`` rules, module doc)."""
    body = "".join(f"    {rule}\n" for rule in rules)
    nat = "".join(f"    {rule}\n" for rule in redirects)
    chains = f"  chain out {{\n    type filter hook output priority 0; policy accept;\n{body}  }}\n"
    if nat:
        chains += (
            f"  chain relay {{\n    type nat hook output priority -100; policy accept;\n{nat}  }}\n"
        )
    return f"table inet jepsen\ndelete table inet jepsen\ntable inet jepsen {{\n{chains}}}\n"


def _used_subnets() -> set[int]:
    used = set()
    for m in re.finditer(
        rf"inet {re.escape(SUBNET_BASE)}\.(\d+)\.", _run(["ip", "-4", "-o", "addr"])
    ):
        used.add(int(m.group(1)))
    return used


@dataclass
class Network:
    """A bridge and one namespace per node name (see the module docstring)."""

    names: list[str]
    run: str = field(default_factory=lambda: f"{os.getpid():06x}{next(_runs) % 16:x}")
    subnet: int = -1
    drops: set[tuple[str, str]] = field(default_factory=set)
    """(from, to) pairs whose packets are dropped; ``to`` may be :data:`HOST`."""
    loss: dict[tuple[str, str], int] = field(default_factory=dict)
    """(from, to) → percent of packets dropped at random."""
    delays: dict[str, tuple[int, int]] = field(default_factory=dict)
    """node → (delay ms, jitter ms) on everything it sends (netem, or the relays)."""
    relay_port: int | None = None
    """The nodes' port: their connections to it go through a delaying relay (module doc)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _made: list[str] = field(default_factory=list)
    _relay_dir: Path | None = None

    # ------------------------------------------------------------ names
    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.run}"

    def namespace(self, name: str) -> str:
        return f"{NS_PREFIX}{self.run}-{name}"

    def _veth(self, name: str) -> str:
        return f"{VETH_PREFIX}{self.run}{self.names.index(name):x}"

    def address(self, name: str) -> str:
        if name == HOST:
            return f"{SUBNET_BASE}.{self.subnet}.1"
        return f"{SUBNET_BASE}.{self.subnet}.{self.names.index(name) + 2}"

    def exec_prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program inside node ``name``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(name)]

    # ------------------------------------------------------------ up, down
    def up(self) -> Network:
        clean_stale()
        used = _used_subnets()
        start = os.getpid() % 200
        self.subnet = next(
            1 + (start + i) % 250 for i in range(250) if 1 + (start + i) % 250 not in used
        )
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            self._made.append(self.bridge)
            _run(["ip", "addr", "add", f"{self.address(HOST)}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for name in self.names:
                ns, veth = self.namespace(name), self._veth(name)
                _run(["ip", "netns", "add", ns])
                self._made.append(ns)
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _run(
                    ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns]
                )
                self._made.append(veth)
                _run(["ip", "-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
                self._apply(name)
            if self.relay_port is not None:
                self._start_relays()
        except BaseException:
            self.down()
            raise
        return self

    def _start_relays(self) -> None:
        """One relay per namespace, listening for each peer (module doc); wait until each
        opened its control socket."""
        self._relay_dir = Path(tempfile.mkdtemp(prefix=f"{NS_PREFIX}{self.run}."))
        path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
        env = {**os.environ, "PYTHONPATH": path}
        for name in self.names:
            routes = [
                f"--route={RELAY_BASE + i}={peer}@{self.address(peer)}:{self.relay_port}"
                for i, peer in enumerate(self.names)
                if peer != name
            ]
            control = self._relay_dir / f"{name}.sock"
            subprocess.Popen(
                [
                    *self.exec_prefix(name),
                    sys.executable,
                    "-m",
                    "tests.jepsen.relay",
                    f"--control={control}",
                    *routes,
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        for name in self.names:
            while not (self._relay_dir / f"{name}.sock").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the relay in {self.namespace(name)} did not start")
                time.sleep(0.05)

    def _tell_relays(self) -> None:
        """Give every relay its delays from :attr:`delays` (caller holds the lock)."""
        assert self._relay_dir is not None
        for name in self.names:
            up = {p: self.delays[name][0] for p in self.names if p != name and name in self.delays}
            down = {p: self.delays[p][0] for p in self.names if p != name and p in self.delays}
            jitter = max((j for _, j in self.delays.values()), default=0)
            asked = json.dumps({"up": up, "down": down, "jitter": jitter}) + "\n"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
                control.settimeout(10)
                control.connect(str(self._relay_dir / f"{name}.sock"))
                control.sendall(asked.encode())
                if control.makefile().readline().strip() != "ok":
                    raise RuntimeError(f"the relay of {name} refused {asked!r}")

    def down(self) -> None:
        """Kill whatever still runs in the namespaces, delete them, the veths and the bridge."""
        for made in reversed(self._made):
            if made.startswith(NS_PREFIX):
                _kill_namespace_processes(made)
                _run(["ip", "netns", "del", made], check=False)
            else:
                _run(["ip", "link", "del", made], check=False)
        self._made.clear()
        if self._relay_dir is not None:  # the relays died with their namespaces
            shutil.rmtree(self._relay_dir, ignore_errors=True)
            self._relay_dir = None

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ------------------------------------------------------------ faults
    def cut(self, a: str, b: str) -> None:
        """No packet between ``a`` and ``b``, either way."""
        self._change(add={(a, b), (b, a)})

    def cut_one_way(self, a: str, b: str) -> None:
        """Packets from ``a`` to ``b`` are dropped; ``b`` to ``a`` still arrive."""
        self._change(add={(a, b)})

    def isolate(self, a: str, clients: bool = False) -> None:
        """Cut ``a`` from every other node (and from the clients with ``clients``)."""
        pairs = {(a, o) for o in self.names if o != a} | {(o, a) for o in self.names if o != a}
        if clients:
            pairs.add((a, HOST))
        self._change(add=pairs)

    def partition(self, side: Iterable[str]) -> None:
        """Two halves: ``side`` and the others, cut from each other."""
        one = set(side)
        pairs = {(x, y) for x in self.names for y in self.names if (x in one) != (y in one)}
        self._change(add=pairs)

    def heal_link(self, a: str, b: str) -> None:
        self._change(remove={(a, b), (b, a)})

    def lose(self, a: str, b: str, percent: int) -> None:
        """Drop ``percent`` % of the packets between ``a`` and ``b`` (both ways), at random."""
        with self._lock:
            self.loss[(a, b)] = self.loss[(b, a)] = percent
            self._apply(a)
            self._apply(b)

    def delay(self, a: str, ms: int, jitter_ms: int = 0) -> None:
        """Delay everything ``a`` sends to the other nodes by ``ms`` ± ``jitter_ms`` (netem,
        or the relays: module doc)."""
        if self._relay_dir is not None and not netem_available():
            with self._lock:
                self.delays[a] = (ms, jitter_ms)
                self._tell_relays()
            return
        if not netem_available():
            raise Unsupported(
                "the kernel has no netem qdisc and this network has no relays: "
                "delay faults are skipped"
            )
        with self._lock:
            self.delays[a] = (ms, jitter_ms)
            _run(
                [
                    *self.exec_prefix(a),
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    "eth0",
                    "root",
                    "netem",
                    "delay",
                    f"{ms}ms",
                    f"{jitter_ms}ms",
                ]
            )

    def heal(self) -> None:
        """Every link works again, with no loss and no delay."""
        with self._lock:
            self.drops.clear()
            self.loss.clear()
            delayed = list(self.delays)
            self.delays.clear()
            for name in self.names:
                self._apply(name)
            if self._relay_dir is not None and not netem_available():
                if delayed:
                    self._tell_relays()
                delayed = []
            for name in delayed:
                _run(
                    [*self.exec_prefix(name), "tc", "qdisc", "del", "dev", "eth0", "root"],
                    check=False,
                )

    def describe(self) -> str:
        with self._lock:
            cuts = sorted(self.drops)
            loss = sorted(self.loss.items())
        parts = [f"{a}->{b}" for a, b in cuts] + [f"{a}~{b}:{p}%" for (a, b), p in loss]
        parts += [f"{a}+{ms}ms" for a, (ms, _) in sorted(self.delays.items())]
        return ", ".join(parts) or "healthy"

    # ------------------------------------------------------------ rules
    def _change(
        self, add: Iterable[tuple[str, str]] = (), remove: Iterable[tuple[str, str]] = ()
    ) -> None:
        added, removed = set(add), set(remove)
        with self._lock:
            self.drops |= added
            self.drops -= removed
            for src in sorted({a for a, _ in added | removed} - {HOST}):
                self._apply(src)

    def _apply(self, name: str) -> None:
        """Rewrite node ``name``'s table from the fault state (caller holds the lock
        or is the only user)."""
        rules = [f"ip daddr {self.address(b)} drop" for a, b in sorted(self.drops) if a == name]
        rules += [
            f"ip daddr {self.address(b)} numgen random mod 100 < {p} drop"
            for (a, b), p in sorted(self.loss.items())
            if a == name
        ]
        redirects = []
        if self.relay_port is not None:
            redirects = [
                f"meta mark != {MARK:#x} ip daddr {self.address(peer)} tcp dport "
                f"{self.relay_port} redirect to :{RELAY_BASE + i}"
                for i, peer in enumerate(self.names)
                if peer != name
            ]
        _run([*self.exec_prefix(name), "nft", "-f", "-"], stdin=_ruleset(rules, redirects))


class Flapper:
    """Cut and heal the link ``a``–``b`` every ``period`` seconds until stopped."""

    def __init__(self, net: Network, a: str, b: str, period: float) -> None:
        self.net, self.a, self.b, self.period = net, a, b, period
        self.flips = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"flap-{a}-{b}", daemon=True)

    def start(self) -> Flapper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        down = False
        while not self._stop.wait(self.period):
            down = not down
            if down:
                self.net.cut(self.a, self.b)
            else:
                self.net.heal_link(self.a, self.b)
            self.flips += 1
        self.net.heal_link(self.a, self.b)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
