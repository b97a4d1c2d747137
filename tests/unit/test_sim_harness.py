"""The tests' driver (nonstop.sim.harness): the rules its users rely on, one at a time."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    Event,
    Log,
    Notify,
    Persist,
    Persisted,
    Received,
    Reply,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.sim.harness import Harness, LoopClock, VirtualClock


class Echo:
    """Answers every message with ``{"echo": payload}``; does whatever a test queues."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.next: list[Action] = []

    def handle(self, event: Event) -> list[Action]:
        self.events.append(event)
        out, self.next = self.next, []
        if isinstance(event, Received) and not (
            isinstance(event.payload, dict) and "echo" in event.payload
        ):
            out.append(Send(event.sender, {"echo": event.payload}))
        return out

    def received(self) -> list[Any]:
        return [e.payload for e in self.events if isinstance(e, Received)]


def two(**kw: Any) -> tuple[Harness, Echo, Echo]:
    h = Harness(rng=random.Random(1), latency=(0.01, 0.02), **kw)
    a, b = Echo(), Echo()
    h.boot("a", a)
    h.boot("b", b)
    return h, a, b


def test_messages_cross_the_wire_with_latency_and_come_back():
    h, a, b = two()
    h.execute("a", [Send("b", {"n": (1, 2)})])
    assert b.received() == []  # nothing happens until the test runs the clock
    h.run(0.015)
    h.run(0.1)
    assert b.received() == [{"n": [1, 2]}]  # msgpack: the tuple arrives as a list
    assert a.received() == [{"echo": {"n": [1, 2]}}]
    assert h.now >= 0.02 and [e.now > 0.01 for e in b.events[1:]] == [True]
    with pytest.raises(TypeError):
        h.execute("a", [Send("b", {"bad": object()})])  # what the wire refuses fails here


def test_cut_links_lose_messages_and_a_restarted_node_gets_none_of_its_previous_life():
    h, a, b = two()
    h.block("a", "b")
    h.execute("a", [Send("b", 1)])
    h.execute("b", [Send("a", {"k": 2})])  # the other way is open
    h.run(0.1)
    assert b.received() == [] and a.received() == [{"k": 2}]
    h.heal()
    h.execute("a", [Send("b", {"k": 3})])
    h.crash("b")
    fresh = Echo()
    h.boot("b", fresh)
    h.run(0.1)
    assert fresh.received() == []  # sent to the crashed incarnation
    h.partition(["a"], ["b"])
    h.execute("a", [Send("b", {"k": 4})])
    h.run(0.1)
    assert fresh.received() == []
    sent_by_a = [s.payload for sender, s in h.sends if sender == "a"]
    assert sent_by_a == [1, {"echo": {"k": 2}}, {"k": 3}, {"k": 4}]  # recorded, lost or not


def test_a_cut_hook_decides_at_delivery():
    h, _, b = two()
    seen: list[tuple[str, str, Any]] = []

    def cut(sender: str, to: str, payload: Any) -> bool:
        seen.append((sender, to, payload))
        return payload == {"k": "lose"}

    h.cut = cut
    h.execute("a", [Send("b", {"k": "lose"}), Send("b", {"k": "keep"})])
    assert seen == []
    h.run(0.1)
    assert b.received() == [{"k": "keep"}]
    assert ("a", "b", {"k": "lose"}) in seen


def test_timers_fire_once_and_only_as_last_set():
    h, a, _ = two()
    h.execute("a", [SetTimer("t", 0.5), SetTimer("u", 0.2), CancelTimer("u")])
    h.execute("a", [SetTimer("t", 1.0)])  # re-armed: the 0.5 one is void
    h.run(2.0)
    fired = [(e.name, round(e.now, 6)) for e in a.events if isinstance(e, TimerFired)]
    assert fired == [("t", 1.0)]
    h.execute("a", [SetTimer("t", 0.1)])
    h.crash("a")
    h.boot("a", a)
    h.run(1.0)
    assert [e.name for e in a.events if isinstance(e, TimerFired)] == ["t"]  # died with it


def test_a_disk_by_hand_holds_writes_until_synced_and_a_crash_loses_them():
    h, a, _ = two()
    h.execute("a", [Persist(1, ((b"k", b"1"),)), Persist(2, ((b"k", None), (b"j", b"2")))])
    h.run(1.0)
    assert h.durable("a") == {} and not any(isinstance(e, Persisted) for e in a.events)
    h.sync("a")
    assert h.durable("a") == {b"j": b"2"}
    assert [e.token for e in a.events if isinstance(e, Persisted)] == [1, 2]
    h.execute("a", [Persist(3, ((b"x", b"3"),))])
    h.crash("a")
    assert h.durable("a") == {b"j": b"2"} and h.disks["a"].pending == []


def test_a_disk_with_latency_acknowledges_in_order_after_the_write():
    h, a, _ = two(disk=(0.1, 0.2))
    h.execute("a", [Persist(1, ((b"k", b"1"),)), Persist(2, ((b"k", b"2"),))])
    h.run(0.09)
    assert h.durable("a") == {}
    h.run_until(lambda: any(isinstance(e, Persisted) and e.token == 2 for e in a.events))
    assert h.durable("a") == {b"k": b"2"}
    done = [(e.token, e.now) for e in a.events if isinstance(e, Persisted)]
    assert [t for t, _ in done] == [1, 2] and 0.2 <= done[1][1] <= 0.4
    with pytest.raises(AssertionError, match="not reached"):
        h.run_until(lambda: False, timeout=1.0)


def test_outputs_are_recorded_and_observers_see_every_handled_event():
    h, a, _ = two()
    seen: list[tuple[str, Event | None, int]] = []
    h.observers.append(lambda name, event, actions: seen.append((name, event, len(actions))))
    outputs: list[Action] = []
    h.on_output = lambda name, action: outputs.append(action)
    a.next = [Reply(7, {"ok": 1}), Notify("n", {"x": 1}), Log("info", "hi")]
    h.deliver("a", Received(h.now, "zz", {"echo": 0}))
    assert h.replies == {7: {"ok": 1}} and [type(o).__name__ for o in outputs] == [
        "Reply",
        "Notify",
        "Log",
    ]
    assert h.notes[0][0] == "a" and h.logs[0][1].message == "hi"
    assert seen == [("a", a.events[-1], 3)]
    h.execute("a", [])
    assert seen[-1] == ("a", None, 0)


def test_a_machine_that_raises_is_reported():
    class Broken:
        def handle(self, event: Event) -> list[Action]:
            if isinstance(event, Started):
                return []
            raise RuntimeError("bug")

    h = Harness()
    h.boot("x", Broken())
    with pytest.raises(RuntimeError):
        h.deliver("x", Received(0.0, "y", 1))
    assert [str(e) for e in h.failures] == ["bug"]
    with pytest.raises(ValueError):
        h.boot("x", Broken())  # running: crash it first


def test_on_an_asyncio_loop_things_happen_as_the_loop_turns():
    async def body() -> tuple[list[Any], list[str]]:
        loop = asyncio.get_running_loop()
        written: list[Persist] = []

        def write(name: str, persist: Persist, done: Any) -> None:
            written.append(persist)
            loop.call_soon(done, None)

        h = Harness(LoopClock(loop), persist=write)
        a, b = Echo(), Echo()
        h.boot("a", a)
        h.boot("b", b)
        h.execute("a", [Send("b", {"k": 1}), SetTimer("t", 0.01), Persist(5, ())])
        with pytest.raises(TypeError):
            h.run(1.0)  # stepping is for a VirtualClock
        await asyncio.sleep(0.05)
        tokens = [e.token for e in a.events if isinstance(e, Persisted)]
        timers = [e.name for e in a.events if isinstance(e, TimerFired)]
        return [b.received(), tokens, len(written)], timers

    got, timers = asyncio.run(body())
    assert got == [[{"k": 1}], [5], 1] and timers == ["t"]


def test_a_virtual_clock_runs_callbacks_in_time_then_scheduling_order():
    clock = VirtualClock()
    order: list[str] = []
    clock.call_later(0.2, lambda: order.append("late"))
    clock.call_at(0.1, lambda: order.append("first"))
    clock.call_at(0.1, lambda: order.append("second"))
    while clock.step():
        pass
    assert order == ["first", "second", "late"] and clock.now == 0.2
    clock.advance(0.1)
    assert clock.now == 0.2  # never backwards
