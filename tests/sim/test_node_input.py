"""ClusterNode never raises for bad input (machine contract rule 5): fuzzed messages, requests."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nonstop.cluster.node import ClusterConfig, ClusterNode
from nonstop.runtime.interface import ClientRequest, Log, Received, Started, TimerFired

pytestmark = pytest.mark.timeout(120)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
kinds = st.sampled_from(["fd", "raft", "adm", "disc", "zzz"])
bodies = st.one_of(
    values,
    st.fixed_dictionaries(
        {
            "t": st.sampled_from(
                [
                    "hello",
                    "ka",
                    "kar",
                    "raft.append",
                    "raft.vote",
                    "raft.prevote",
                    "raft.join",
                    "raft.snap",
                ]
            )
        },
        optional={
            "id": values,
            "en": values,
            "n": values,
            "term": values,
            "ents": values,
            "peers": values,
            "ack": values,
        },
    ),
    st.fixed_dictionaries(
        {"op": st.sampled_from(["join", "leave", "propose"])},
        optional={"name": values, "fwd": values, "re": values, "reply": values},
    ),
)
envelopes = st.one_of(
    values, st.fixed_dictionaries({"k": kinds, "b": bodies}, optional={"en": values})
)
requests = st.one_of(
    values,
    st.fixed_dictionaries(
        {"op": st.sampled_from(["status", "join", "leave", "propose", "x"])},
        optional={"name": values, "address": values, "value": values},
    ),
)


def fresh() -> ClusterNode:
    cfg = ClusterConfig(
        name="n1",
        address="sim://n1",
        store_timestamp=1,
        members=("n1", "n2", "n3"),
        static_peers={"n2": "sim://n2", "n3": "sim://n3"},
    )
    node = ClusterNode(cfg, random.Random(1), {})
    node.handle(Started(0.0))
    return node


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["n2", "n3", "n9"]), envelopes), max_size=6), requests)
def test_malformed_messages_and_requests_never_raise(messages, request):
    node = fresh()
    t = 0.0
    for sender, payload in messages:
        t += 0.01
        actions = node.handle(Received(t, sender, payload))
        assert isinstance(actions, list)
    node.handle(TimerFired(t + 0.1, "fd:tick"))
    node.handle(TimerFired(t + 0.1, "bogus"))
    replies = node.handle(ClientRequest(t + 0.2, 1, request))
    assert [a for a in replies if not isinstance(a, Log)], "every request is answered or forwarded"
