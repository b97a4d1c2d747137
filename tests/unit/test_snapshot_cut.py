"""The pieces of a cluster snapshot's cut (docs/design/snapshot-stamps.md §2): the commit
journal each store keeps, and the coordinator's verdict on the nodes' answers."""

from __future__ import annotations

from nonstop.dataplane.snapshot_cut import torn
from nonstop.tx.commit_journal import CommitJournal


def test_the_journal_stamps_notes_in_order_and_names_prepares_after_a_stamp() -> None:
    j = CommitJournal(keep=10.0)
    j.note_prepared("g1", now=0.0)
    mark = j.counter
    j.note_prepared("g2", now=1.0)
    j.note_applied("g1", now=1.5)
    j.note_prepared("g3", now=2.0)
    assert j.counter == 4
    assert sorted(j.prepared_since(mark, now=2.0) or []) == ["g2", "g3"]
    assert j.prepared_since(j.counter, now=2.0) == []
    assert j.applied_stamp("g1") == 3 and j.applied_stamp("g2") is None


def test_the_journal_forgets_after_keep_and_then_refuses_to_answer_for_older_stamps() -> None:
    j = CommitJournal(keep=10.0)
    j.note_prepared("old", now=0.0)
    j.note_applied("old", now=0.0)
    j.note_prepared("new", now=20.0)  # drops the notes older than 10 s
    assert j.applied_stamp("old") is None
    assert j.prepared_since(0, now=20.0) is None  # a prepare after stamp 0 was dropped
    assert j.prepared_since(2, now=20.0) == ["new"]


def test_a_commit_seen_on_one_node_and_missing_on_another_tears_the_cut() -> None:
    unsure = {"A": {"g1"}, "B": set(), "C": {"g2"}}
    assert torn(unsure, {"A": set(), "B": {"g1"}, "C": set()})  # B shows g1, A lacks it
    assert not torn(unsure, {"A": set(), "B": set(), "C": set()})  # nowhere: consistent
    # A node's own unsure gtid that it may show (an ambiguous note) is not a tear by itself.
    assert not torn(unsure, {"A": {"g1"}, "B": set(), "C": set()})
