"""Runnable demos (``make demo``, ``make demo-embedded``) and their bank application.

* :mod:`nonstop.demos.cluster` — the main job: a local cluster, Spark, a node killed;
* :mod:`nonstop.demos.embedded` — the same bank on one embedded store;
* :mod:`nonstop.demos.bank` — the bank application module every node loads.
"""
