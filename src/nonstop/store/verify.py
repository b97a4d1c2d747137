"""Verify an LMDB directory of a node (object store or cluster store): structure and checksums.

LMDB keeps no page checksums, so damage to a B-tree page shows as keys out of
order, a count that does not match the tree, a cursor error, or (worst) a
lookup that silently misses.  :func:`verify` walks every named database with a
cursor and checks, within a time and record budget:

* the file is at least as long as the pages its meta page announces (a shorter
  file is a SIGBUS when mapped pages are touched);
* keys (and, in a dupsort database, duplicates) are strictly increasing, and
  the number walked equals the tree's own entry count;
* every checksummed value passes its CRC-32: ``objects`` and ``prepared`` of an object store
  (:mod:`nonstop.store.records`), ``state`` and ``meta`` of a cluster store
  (:mod:`nonstop.runtime.storage`); object references are 20 bytes;
* every ``extents`` entry of an object store has its object;
* with ``deep`` (the scrub): every index entry names an existing object whose
  field encodes to the entry's key, and every type's count equals its extent.

A damaged page may still crash the reading process (LMDB follows page numbers
it trusts), so :func:`verify_isolated` runs the walk in a forked child: a child
killed by a signal becomes a problem line ("reading ... crashed with SIGBUS"),
never the death of the caller.  The node runs it at start (bounded), and
``nonstop store verify PATH`` runs it in full (``nonstop.admin.scrub``).
"""

from __future__ import annotations

import json
import os
import signal
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import lmdb

from nonstop.model.codec import encode_key, unpack

REF_SIZE = 20
LOCATION_BYTES = 8  # (model.ref's: a reference's location prefix)
_CRC = 4
RESIDUE = 0x2144DF1C  # the CRC-32 of any payload + its CRC-32 (little-endian)
# Databases whose every value is CRC-32 + payload, by kind of directory.
_SEALED = {"object": {b"objects", b"prepared"}, "cluster": {b"state", b"meta"}}


@dataclass
class Report:
    """What a verification found.  ``problems`` are one-line messages (file, database, key)."""

    path: str
    kind: str = "LMDB"
    databases: int = 0
    records: int = 0
    complete: bool = True
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line: the first problem (and how many more), or what was checked."""
        if self.problems:
            more = len(self.problems) - 1
            return self.problems[0] + (f" (and {more} more problems)" if more else "")
        scope = "all" if self.complete else "the first (budget reached)"
        return (
            f"{self.path}: {self.kind} store OK ({scope} {self.records} records of "
            f"{self.databases} databases in {self.seconds:.2f} s)"
        )


class _Budget(Exception):
    """The time or record budget ran out."""


def verify(
    path: str, *, seconds: float | None = None, records: int | None = None, deep: bool = False
) -> Report:
    """Verify the LMDB directory ``path`` (see the module doc); never raises for damage.

    ``deep`` adds the cross-checks of an object store's bookkeeping (:func:`_cross_check`):
    the scrub command runs them; the start check does not (a count or index bug would
    then stop a node that serves correct objects)."""
    report = Report(path=path)
    data = os.path.join(path, "data.mdb")
    started = time.monotonic()
    try:
        size = os.stat(data).st_size
    except FileNotFoundError:
        report.problems.append(f"{data} is missing")
        return report
    except OSError as exc:
        report.problems.append(f"{data} cannot be read: {exc.strerror}")
        return report
    if size < 8192:
        report.problems.append(f"{data} is truncated ({size} bytes; LMDB needs at least 8192)")
        return report
    env = _open(path, report)
    if env is None:
        return report
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if size < needed:
            report.problems.append(f"{data} is truncated ({size} bytes; its pages need {needed})")
            return report
        deadline = None if seconds is None else started + seconds
        _walk(env, data, report, deadline, records, deep)
    except lmdb.Error as exc:
        report.problems.append(f"{data} is damaged: {exc}")
    finally:
        env.close()
        report.seconds = time.monotonic() - started
    return report


def _open(path: str, report: Report) -> lmdb.Environment | None:
    data = os.path.join(path, "data.mdb")
    last: Exception | None = None
    # With the lock file first (safe next to a running node); without it where the
    # lock file cannot be written (a read-only copy).
    for lock in (True, False):
        try:
            return lmdb.open(
                path, readonly=True, lock=lock, max_dbs=1024, subdir=True, map_size=1 << 38
            )
        except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError) as exc:
            report.problems.append(f"{data} is damaged: {exc}")
            return None
        except lmdb.Error as exc:
            last = exc
    report.problems.append(f"{data} cannot be opened: {last}")
    return None


def _walk(
    env: lmdb.Environment,
    data: str,
    report: Report,
    deadline: float | None,
    limit: int | None,
    deep: bool,
) -> None:
    with env.begin() as txn:
        names = [bytes(k) for k in txn.cursor().iternext(values=False)]
    kind = "cluster" if b"state" in names else "object" if b"objects" in names else "LMDB"
    report.kind = kind
    sealed = _SEALED.get(kind, set())
    # objects before extents: the extents check looks objects up
    order = sorted(names, key=lambda n: (n != b"objects", n))
    opened: dict[bytes, Any] = {}
    with env.begin(buffers=True) as txn:
        for name in order:
            try:
                db = env.open_db(name, txn=txn, create=False)
            except lmdb.Error as exc:
                report.problems.append(f"{data}: database {name.decode(errors='replace')!r}: {exc}")
                continue
            opened[name] = db
            report.databases += 1
            # every extents entry names an object: look it up (store only)
            objects = opened.get(b"objects") if kind == "object" and name == b"extents" else None
            try:
                shape = _SHAPES.get(name) or (_index_shape if name.startswith(b"ix:") else None)
                _walk_db(
                    txn,
                    db,
                    name,
                    name in sealed,
                    objects,
                    data,
                    report,
                    deadline,
                    limit,
                    shape if kind == "object" else None,
                )
            except _Budget:
                report.complete = False
                return
            except lmdb.Error as exc:
                report.problems.append(
                    f"{data}: database {name.decode(errors='replace')!r} is damaged: {exc}"
                )
        if deep and kind == "object" and b"objects" in opened:
            try:
                _cross_check(txn, opened, data, report, deadline, limit)
            except _Budget:
                report.complete = False
            except lmdb.Error as exc:
                report.problems.append(f"{data} is damaged: {exc}")


Shape = Callable[[bytes, bytes], str | None]
"""A database's record → what is wrong with its form (None: nothing)."""


def _fixed(key_size: int | None, value_size: int) -> Shape:
    def check(key: bytes, value: bytes) -> str | None:
        if key_size is not None and len(key) != key_size:
            return f"a key of {len(key)} bytes, not {key_size} (damaged)"
        if len(value) != value_size:
            return f"a value of {len(value)} bytes, not {value_size} (damaged)"
        return None

    return check


def _counts_shape(key: bytes, value: bytes) -> str | None:
    if len(key) < LOCATION_BYTES + 1 or key[-LOCATION_BYTES - 1] != 0:
        return "not a type name + 0x00 + location (damaged)"
    return _fixed(None, 8)(key, value)


def _index_shape(key: bytes, value: bytes) -> str | None:
    # A unique index's value, or each duplicate of a non-unique one, is a reference.
    return None if len(value) == REF_SIZE else f"a value of {len(value)} bytes is no reference"


def _packed(key: bytes, value: bytes) -> str | None:
    try:
        unpack(value)
    except Exception as exc:  # any decoding error is damage; msgpack raises several kinds
        return f"a value that does not decode ({type(exc).__name__}: damaged)"
    return None


_SHAPES: dict[bytes, Shape] = {
    # The object store's databases without a checksum: their records have a fixed
    # form (store/lmdb_store.py), so damage shows as a record of the wrong form.
    b"seqs": _fixed(LOCATION_BYTES + 4, 8),
    b"counts": _counts_shape,
    b"extents": _fixed(None, 0),
    b"meta": _packed,
    b"types": _packed,
    b"asyncq": _packed,
    b"dead": _packed,
    b"results": _packed,
}


def _walk_db(
    txn: lmdb.Transaction,
    db: Any,
    name: bytes,
    sealed: bool,
    objects: Any,
    data: str,
    report: Report,
    deadline: float | None,
    limit: int | None,
    shape: Shape | None = None,
) -> None:
    shown = name.decode(errors="replace")
    dupsort = bool(db.flags(txn)["dupsort"])
    expected = txn.stat(db)["entries"]
    previous: tuple[bytes, bytes] | None = None
    walked = 0
    for k, v in txn.cursor(db=db):
        walked += 1
        report.records += 1
        if limit is not None and report.records > limit:
            raise _Budget
        if deadline is not None and not report.records & 255 and time.monotonic() > deadline:
            raise _Budget
        key = bytes(k)
        here = (key, bytes(v) if dupsort else b"")
        if previous is not None and not previous < here:
            report.problems.append(
                f"{data}: database {shown!r}: key {key.hex()} out of order (damaged B-tree page)"
            )
        previous = here
        if sealed and (len(v) < _CRC or zlib.crc32(v) != RESIDUE):
            report.problems.append(
                f"{data}: database {shown!r}, key {key.hex()} fails its checksum"
            )
        wrong = None if shape is None else shape(key, bytes(v))
        if wrong is not None:
            report.problems.append(f"{data}: database {shown!r}, key {key.hex()}: {wrong}")
        if sealed and name == b"objects" and len(key) != REF_SIZE:
            report.problems.append(
                f"{data}: database 'objects': key {key.hex()} is not a reference (damaged)"
            )
        if objects is not None:
            ref = key[key.find(b"\x00") + 1 :]
            if txn.get(ref, db=objects) is None:
                report.problems.append(
                    f"{data}: database 'extents': object {ref.hex()} is listed but missing "
                    "from 'objects' (damaged B-tree page)"
                )
    if walked != expected:
        report.problems.append(
            f"{data}: database {shown!r} holds {walked} entries, its tree says {expected} "
            "(damaged B-tree page)"
        )


def _cross_check(
    txn: lmdb.Transaction,
    opened: dict[bytes, Any],
    data: str,
    report: Report,
    deadline: float | None,
    limit: int | None,
) -> None:
    """Every index entry points at an object whose field encodes to the entry's key; every
    type's count equals its extent's size."""
    objects = opened[b"objects"]

    def tick() -> None:
        report.records += 1
        if limit is not None and report.records > limit:
            raise _Budget
        if deadline is not None and not report.records & 255 and time.monotonic() > deadline:
            raise _Budget

    states: dict[bytes, Any] = {}
    for name, db in opened.items():
        if not name.startswith(b"ix:"):
            continue
        field = name.rsplit(b":", 1)[1].decode(errors="replace")
        for k, v in txn.cursor(db=db):
            tick()
            ref = bytes(v)
            state = states.get(ref)
            if state is None:
                raw = txn.get(ref, db=objects)
                if raw is None:
                    report.problems.append(
                        f"{data}: index {name.decode(errors='replace')!r}: key {bytes(k).hex()} "
                        f"names object {ref.hex()}, which is missing"
                    )
                    continue
                if zlib.crc32(raw) != RESIDUE:
                    continue  # reported by the walk
                state = states[ref] = unpack(bytes(raw[:-_CRC]))[3]
                if len(states) > 100_000:
                    states.clear()
            try:
                same = field in state and encode_key(state[field]) == bytes(k)
            except Exception:
                same = False
            if not same:
                report.problems.append(
                    f"{data}: index {name.decode(errors='replace')!r}: key {bytes(k).hex()} "
                    f"does not match object {ref.hex()}'s {field!r}"
                )
    counts = opened.get(b"counts")
    extents = opened.get(b"extents")
    if counts is None or extents is None:
        return
    sizes: dict[bytes, int] = {}
    for k in txn.cursor(db=extents).iternext(values=False):
        tick()
        # type name + 0x00 + ref -> the count's key: type name + 0x00 + the ref's location
        name = bytes(k)[: -(REF_SIZE - LOCATION_BYTES)]
        sizes[name] = sizes.get(name, 0) + 1
    for k, v in txn.cursor(db=counts):
        tick()
        key = bytes(k)
        stored = int.from_bytes(bytes(v), "big")
        size = sizes.pop(key, 0)
        if stored != size:
            report.problems.append(
                f"{data}: database 'counts': {_count_name(key)} counts "
                f"{stored}, its extent holds {size}"
            )
    for key, size in sizes.items():
        report.problems.append(
            f"{data}: database 'counts': {_count_name(key)} has no count, its extent holds {size}"
        )


def _count_name(key: bytes) -> str:
    """A ``counts`` key as people read it: ``type name @ location``."""
    if len(key) < 9 or key[-9] != 0:
        return key.decode(errors="replace")
    return f"{key[:-9].decode(errors='replace')} @ location {key[-8:].hex()}"


def verify_isolated(
    path: str, *, seconds: float | None = None, records: int | None = None, deep: bool = False
) -> Report:
    """:func:`verify` in a forked child, so a damaged page that crashes LMDB cannot kill us."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: verify, send the report, leave without cleanup
        code = 0
        try:
            os.close(rfd)
            report = verify(path, seconds=seconds, records=records, deep=deep)
            out = json.dumps(asdict(report)).encode()
            with os.fdopen(wfd, "wb") as pipe:
                pipe.write(out)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as pipe:
        raw = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return Report(
            path=path,
            complete=False,
            problems=[
                f"{os.path.join(path, 'data.mdb')} is damaged: reading it crashed with {sig}"
            ],
        )
    try:
        return Report(**json.loads(raw))
    except (ValueError, TypeError):
        return Report(
            path=path,
            complete=False,
            problems=[f"{path}: the verification failed (exit status {status})"],
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m nonstop.store.verify PATH... [--nice]``: one JSON report per path on
    stdout, exit code 1 if any is damaged (what the node's background scrub runs;
    ``--nice`` lowers its CPU priority first)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if "--nice" in args:
        os.nice(10)
    paths = [a for a in args if a != "--nice"]
    reports = [verify_isolated(p) for p in paths]
    print(json.dumps([asdict(r) for r in reports]))
    return 0 if all(r.ok for r in reports) else 1


__all__ = ["Report", "main", "verify", "verify_isolated"]

if __name__ == "__main__":
    raise SystemExit(main())
