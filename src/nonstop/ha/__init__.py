"""High availability: partitions, their table in the cluster log, failover (docs/design/ha.md).

Sans-I/O like ``nonstop.dtx``: no asyncio, no imports of the data plane, the
runtime's real side or the node process.
"""
