"""Bulk operations for the Spark pipeline: scans, loads and overwrites of whole types.

* :mod:`nonstop.bulk.handlers` — the ``bulk.*`` ops a node answers;
* :mod:`nonstop.bulk.fast` — the column-wise fast path of bulk loads;
* :mod:`nonstop.bulk.server` — a bulk endpoint over one embedded store (no cluster).
"""
