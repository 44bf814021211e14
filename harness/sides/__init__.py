"""Running the two sides on one item and collecting what each returned.

:mod:`.loading` names, loads and closes ports; :mod:`.items` is what a
compared item is (statuses, :class:`~harness.sides.items.CaseResult`, the
steps every level shares); :mod:`.runner` and :mod:`.sparse_runner` compare
each level; :mod:`.dcp_ranks` runs DCP ranks as real processes;
:mod:`.time_limits` bounds a port call. Worker processes: how many and how
items are cut (:mod:`.job_sizing`), a worker (:mod:`.pool_worker`), the pool
(:mod:`.pool`) and a run's items streamed over it (:mod:`.item_stream`). The
oracle's answers kept (:mod:`.oracle_cache`: its keys :mod:`.oracle_cache_keys`,
what is kept :mod:`.oracle_cache_answers`, the disk :mod:`.oracle_cache_store`).
Imports: the oracle, the ports, and the layers below them.
"""
