"""Real network partitions: node processes in network namespaces under a bank load.

``netns.py`` builds the network (a bridge, one namespace per node) and breaks
it; ``cluster.py`` runs the nodes inside it; ``bank.py`` is the load and its
checks; ``scenarios.py`` the faults of one round; ``python -m tests.jepsen``
the campaign (docs/testing.md, "Network partitions").
"""
