"""Benchmarks for nonstop: ``make bench`` (``python -m bench.run``).

* :mod:`bench.local_bench` — the embedded database against its peers, written to
  ``bench/results/local.md``;
* :mod:`bench.peers` — the peers (SQLite in WAL mode with ``synchronous=FULL``,
  raw LMDB batched puts) and the measurement helpers every benchmark shares;
* :mod:`bench.run` — the command line.
"""
