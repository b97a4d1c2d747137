"""The faults of a round, and one round: a fresh cluster, the load, faults, heal, checks.

Each scenario is a function of a :class:`Faults` context that breaks the
network for a while and heals it; the round (:func:`run_round`) waits after
every heal until the cluster is Active again (a cluster that does not get
there within ``settle_s`` is a finding: *stuck*), keeps the load running a
little longer to see commits resume, and then judges everything with
:func:`tests.jepsen.bank.final_check`.  Everything random comes from the
round's seed; the seed and the command that replays it are in every report.

Named scenarios (``SCENARIOS``): ``leader`` isolates the cluster-log leader;
``participant`` isolates a node the moment its status shows a prepared
two-phase-commit branch (mid-commit); ``coordinator`` isolates, from peers
and clients, a node while it coordinates a commit; ``branch`` cuts only the
link between a prepared participant and its coordinator; ``one-way`` drops packets from one node
to another but not back; ``flap`` cuts and heals one link every 100-500 ms;
``partition`` splits a minority from a majority; ``loss`` drops a share of the
packets on some links; ``delay`` delays everything one node sends to the
others by 20-300 ms (netem where the kernel has it, else the relays of
:mod:`tests.jepsen.relay`, which only a ``delay`` round sets up); ``mix`` draws
several of these (and the client-side isolation of a node) at random (its delays
are skipped without netem: no relays).  ``short`` -- what ``make test`` runs -- is
``leader``, ``participant``, ``one-way`` and ``flap`` one after another.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nonstop.client import Client
from nonstop.errors import Error
from tests.jepsen.bank import BankLoad, final_check
from tests.jepsen.cluster import PORT, NetnsCluster
from tests.jepsen.netns import Flapper, Network, Unsupported, netem_available

MID_COMMIT = ("persisting", "prepared")
"""Branch states (dtx/protocol.py) between a participant's prepare and the outcome."""


@dataclass
class Faults:
    """What a scenario works with, and the timeline it writes."""

    net: Network
    cluster: NetnsCluster
    rng: random.Random
    fault_s: float
    settle_s: float
    vary: bool = False
    start: float = field(default_factory=time.monotonic)
    timeline: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    observed: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    """Per fault: what, how long it held, commits/s meanwhile, seconds to Active after."""
    acked: Callable[[], int] = field(default_factory=lambda: lambda: 0)
    """How many transfers the load has had acknowledged so far."""

    def log(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.start:6.2f}s {what}")

    def fault(self, what: str) -> None:
        """Log a fault that begins now; :meth:`hold` and :meth:`heal` add its numbers."""
        self.log(what)
        self.faults.append({"fault": what})

    def hold(self, seconds: float | None = None) -> None:
        """Let the fault last ``fault_s`` (with ``vary``: 0.25 to 2.5 times that, so that
        some faults outlast the clients' timeouts and some do not)."""
        if seconds is None:
            seconds = self.fault_s * (self.rng.uniform(0.25, 2.5) if self.vary else 1.0)
        before = self.acked()
        time.sleep(seconds)
        n = self.acked() - before
        self.log(f"  held {seconds:.1f}s: {n} transfers acknowledged ({n / seconds:.0f}/s)")
        if self.faults and "held_s" not in self.faults[-1]:
            self.faults[-1].update(held_s=round(seconds, 1), rate=round(n / seconds))

    def heal(self) -> None:
        """Heal everything and wait for the cluster to be Active again."""
        self.net.heal()
        self.log("heal")
        try:
            took = self.cluster.wait_active(timeout=self.settle_s)
            self.log(f"Active again after {took:.1f}s")
            if self.faults and "active_s" not in self.faults[-1]:
                self.faults[-1]["active_s"] = round(took, 1)
        except TimeoutError:
            states = {}
            for name in self.cluster.names:
                with contextlib.suppress(Error, OSError):
                    st = self.cluster.status(name)
                    states[name] = (st.get("quorum"), st.get("leader"), st.get("live"))
            self.problems.append(
                f"stuck: not Active {self.settle_s:.0f}s after the heal ({states})"
            )
            self.log("NOT Active after the heal")

    def observe(self, victim: str) -> None:
        """Log how the others see ``victim`` now (proof that the fault took effect)."""
        seen = {}
        for name in self.others(victim):
            with contextlib.suppress(Error, OSError):
                st = self.cluster.status(name)
                states = {n["name"]: n["state"] for n in st.get("nodes", [])}
                seen[name] = f"{st.get('quorum')}, {victim} {states.get(victim)}"
        self.observed.append((victim, seen))
        self.log(f"seen: {seen}")

    def diagnose(self) -> None:
        """After a failed round: what each node still holds (two-phase commit state)."""
        for name in self.cluster.names:
            try:
                st = self.cluster.status(name)
                self.log(
                    f"status {name}: {st.get('quorum')}, leader {st.get('leader')}, "
                    f"dtx {st.get('dtx')}"
                )
            except (Error, OSError) as exc:
                self.log(f"status {name}: {exc!r}")
            with contextlib.suppress(Error, OSError):
                with Client([self.cluster.address(name)], timeout=2.0, rounds=1) as c:
                    stats = c.request({"op": "runtime_stats"})
                data = stats.get("data") if isinstance(stats, dict) else None
                self.log(f"data path counters {name}: {data}")

    def observe_pair(self, a: str, b: str) -> None:
        """Log how ``a`` and ``b`` see each other now (a one-way cut is asymmetric)."""
        seen = {}
        for x, y in ((a, b), (b, a)):
            with contextlib.suppress(Error, OSError):
                st = self.cluster.status(x)
                states = {n["name"]: n["state"] for n in st.get("nodes", [])}
                seen[x] = f"{st.get('quorum')}, {y} {states.get(y)}, leader {st.get('leader')}"
        self.log(f"seen: {seen}")

    def wait_for_status(
        self, names: list[str], pick: Callable[[dict[str, Any]], list[str]], timeout: float = 5.0
    ) -> tuple[str | None, str | None]:
        """Poll the nodes' status until ``pick`` finds something on one: (node, what)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in names:
                with contextlib.suppress(Error, OSError):
                    found = pick(self.cluster.status(name))
                    if found:
                        return name, found[0]
        return None, None

    def leader(self, timeout: float = 10.0) -> str:
        """The cluster-log leader (the load makes one: commit decisions go in the log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lead = self.cluster.leader()
            if lead is not None:
                return lead
            time.sleep(0.1)
        return self.rng.choice(self.cluster.names)

    def others(self, *not_these: str) -> list[str]:
        return [n for n in self.cluster.names if n not in not_these]


# ------------------------------------------------------------------ scenarios
def prepared_for_another(status: dict[str, Any]) -> list[str]:
    """The branches a node's status shows prepared for a commit another node coordinates
    (a branch id starts with its coordinator's name: ``A.52``)."""
    branches = status.get("dtx", {}).get("branches", {})
    return [
        g
        for g, state in branches.items()
        if state in MID_COMMIT and g.split(".")[0] != status.get("name")
    ]


def isolate_leader(f: Faults) -> None:
    lead = f.leader()
    f.net.isolate(lead)
    f.fault(f"isolate the leader {lead}")
    f.hold()
    f.observe(lead)
    f.heal()


def isolate_participant(f: Faults) -> None:
    """Isolate a node (not the leader) while one of its 2PC branches is prepared."""
    lead = f.leader()
    candidates = f.others(lead) or f.cluster.names
    victim, branch = f.wait_for_status(candidates, prepared_for_another)
    if victim is None:
        victim = f.rng.choice(candidates)
        f.fault(f"no prepared branch seen in 5 s; isolate participant {victim} anyway")
    else:
        f.fault(f"isolate participant {victim} mid-commit (branch {branch})")
    f.net.isolate(victim)
    f.hold()
    f.observe(victim)
    f.heal()


def cut_branch(f: Faults) -> None:
    """Cut only the link between a prepared participant and its coordinator (the branch
    id names the coordinator: ``A.52``); both still reach the rest of the cluster, where
    the commit decision is logged."""
    victim, branch = f.wait_for_status(f.cluster.names, prepared_for_another)
    coordinator = branch.split(".")[0] if branch else None
    if victim is None or coordinator not in f.cluster.names or coordinator == victim:
        victim, coordinator = f.rng.sample(f.cluster.names, 2)
        f.fault(f"no prepared branch seen in 5 s; cut {victim} <-> {coordinator} anyway")
    else:
        f.fault(f"cut participant {victim} <-> its coordinator {coordinator} ({branch})")
    f.net.cut(victim, coordinator)
    f.hold()
    f.observe_pair(victim, coordinator)
    f.heal()


def isolate_coordinator(f: Faults) -> None:
    """Isolate a node, clients included, while it coordinates a commit: the client's
    commit reply is lost and ``request.result`` cannot reach the node either, so the
    outcome is unknown to the client until the end (resolved from the records)."""
    victim, gtid = f.wait_for_status(
        f.cluster.names, lambda st: sorted(st.get("dtx", {}).get("coordinating", {}))
    )
    if victim is None:
        victim = f.rng.choice(f.cluster.names)
        f.fault(f"no commit being coordinated seen in 5 s; isolate {victim} anyway")
    else:
        f.fault(f"isolate coordinator {victim} mid-commit ({gtid}), clients too")
    f.net.isolate(victim, clients=True)
    f.hold()
    f.observe(victim)
    f.heal()


def one_way(f: Faults) -> None:
    lead = f.leader()
    other = f.rng.choice(f.others(lead))
    a, b = (lead, other) if f.rng.random() < 0.5 else (other, lead)
    f.net.cut_one_way(a, b)
    f.fault(f"one-way cut {a} -> {b}")
    f.hold()
    f.observe_pair(a, b)
    f.heal()


def flap(f: Faults) -> None:
    a, b = f.rng.sample(f.cluster.names, 2)
    period = f.rng.choice([0.1, 0.2, 0.3, 0.5])
    flapper = Flapper(f.net, a, b, period).start()
    f.fault(f"flap {a} <-> {b} every {period * 1000:.0f} ms")
    try:
        f.hold()
    finally:
        flapper.stop()
    f.log(f"flapped {flapper.flips} times")
    f.heal()


def partition(f: Faults) -> None:
    names = f.cluster.names
    minority = f.rng.sample(names, (len(names) - 1) // 2)
    f.net.partition(minority)
    f.fault(f"partition {minority} | {f.others(*minority)}")
    f.hold()
    f.heal()


def loss(f: Faults) -> None:
    a, b = f.rng.sample(f.cluster.names, 2)
    percent = f.rng.choice([10, 30, 50])
    f.net.lose(a, b, percent)
    f.fault(f"lose {percent}% between {a} and {b}")
    f.hold()
    f.heal()


def isolate_from_clients(f: Faults) -> None:
    """A node cut from its peers and from the clients (their commits there go unknown)."""
    victim = f.rng.choice(f.cluster.names)
    f.net.isolate(victim, clients=True)
    f.fault(f"isolate {victim} from everyone, clients too")
    f.hold()
    f.observe(victim)
    f.heal()


def delay(f: Faults) -> None:
    """Delay everything one node sends to the others (a slow link, not a cut: with 300 ms
    its peers' failure detectors, 0.5 s, are close to calling it Down)."""
    victim = f.rng.choice(f.cluster.names)
    ms = f.rng.choice([20, 50, 100, 300])
    try:
        f.net.delay(victim, ms, 20)
    except Unsupported as exc:
        f.log(f"skip delay: {exc}")
        return
    f.fault(f"delay everything {victim} sends by {ms} ms ± 20")
    f.hold()
    f.observe(victim)
    f.heal()


def mix(f: Faults) -> None:
    """Three to five faults drawn at random, some overlapping (no heal in between)."""
    steps = f.rng.randint(3, 5)
    for _ in range(steps):
        kind = f.rng.choice(list(SINGLE))
        if kind in ("one-way", "loss", "partition") and f.rng.random() < 0.3:
            # Overlap: this fault on top of another one, healed together.
            second = f.rng.choice(["one-way", "loss", "leader"])
            f.log(f"overlap {kind} + {second}")
            saved, f.fault_s = f.fault_s, f.fault_s / 2
            try:
                _without_heal(f, kind)
                SINGLE[second](f)
            finally:
                f.fault_s = saved
        else:
            SINGLE[kind](f)


def _without_heal(f: Faults, kind: str) -> None:
    heal, f.heal = f.heal, lambda: None  # type: ignore[method-assign]
    try:
        SINGLE[kind](f)
    finally:
        f.heal = heal  # type: ignore[method-assign]


def short(f: Faults) -> None:
    """The four the issue names, one after another (``make test``)."""
    for step in (isolate_leader, isolate_participant, one_way, flap):
        step(f)


SINGLE: dict[str, Callable[[Faults], None]] = {
    "leader": isolate_leader,
    "participant": isolate_participant,
    "coordinator": isolate_coordinator,
    "branch": cut_branch,
    "one-way": one_way,
    "flap": flap,
    "partition": partition,
    "loss": loss,
    "clients": isolate_from_clients,
    "delay": delay,
}
SCENARIOS: dict[str, Callable[[Faults], None]] = {**SINGLE, "mix": mix, "short": short}


# ------------------------------------------------------------------ a round
@dataclass
class RoundResult:
    seed: int
    scenario: str
    problems: list[str]
    stats: dict[str, Any]
    timeline: list[str]
    seconds: float
    observed: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    baseline: float = 0.0
    """Transfers acknowledged per second before the first fault."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> str:
        head = f"seed {self.seed} scenario {self.scenario}: {'ok' if self.ok else 'FAILED'}"
        lines = [f"{head} ({self.seconds:.0f}s) {self.stats}"]
        lines += [f"  {t}" for t in self.timeline]
        lines += [f"  PROBLEM {p}" for p in self.problems]
        return "\n".join(lines)


def run_round(
    folder: Path,
    seed: int,
    scenario: str = "short",
    nodes: int = 3,
    clients: int = 4,
    fault_s: float = 3.0,
    settle_s: float = 30.0,
    after_heal_s: float = 1.5,
    vary: bool = False,
    final_timeout: float = 45.0,
) -> RoundResult:
    """One round on a fresh network and cluster (module docstring)."""
    began = time.monotonic()
    names = [chr(ord("A") + i) for i in range(nodes)]
    rng = random.Random(seed)
    # The relays (delay without netem) change the path of every peer connection: only a
    # round that delays has them.
    relay_port = PORT if scenario == "delay" and not netem_available() else None
    with Network(names, relay_port=relay_port) as net, NetnsCluster(folder, net) as cluster:
        cluster.start_all()
        load = BankLoad(cluster.addresses, names, clients=clients, seed=seed)
        load.open_accounts()
        f = Faults(net, cluster, rng, fault_s, settle_s, vary, acked=lambda: len(load.ledger.acked))
        f.log(f"{nodes} nodes in {net.bridge} ({net.address('A')}...), {clients} clients")
        load.start()
        try:
            f.hold(1.5)
            baseline = len(load.ledger.acked) / 1.5
            SCENARIOS[scenario](f)
            net.heal()
            before = len(load.ledger.acked)
            f.hold(after_heal_s)
            if len(load.ledger.acked) == before:
                f.problems.append(f"no transfer committed in the {after_heal_s}s after the heal")
        finally:
            hung = load.stop()
            net.heal()
        if hung:
            f.problems.append(f"clients still blocked 60s after the stop: {hung}")
        verdict = final_check(load, timeout=final_timeout)
        f.log("final read and checks done")
        if f.problems or verdict.problems:
            f.diagnose()
    stats = dict(verdict.stats)
    return RoundResult(
        seed,
        scenario,
        f.problems + verdict.problems,
        stats,
        f.timeline,
        time.monotonic() - began,
        f.observed,
        f.faults,
        baseline,
    )
