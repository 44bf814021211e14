"""Running the two sides on one item and collecting what each returned.

:mod:`.loading` names and loads ports; :mod:`.items` is what a compared item
is (statuses, :class:`~harness.sides.items.CaseResult`, the steps every
level shares); :mod:`.runner` and :mod:`.sparse_runner` compare each level;
:mod:`.dcp_ranks` runs DCP ranks as real processes; :mod:`.pool` spreads items
over worker processes; :mod:`.oracle_cache` keeps the oracle's answers;
:mod:`.time_limits` bounds a port call. Imports: the oracle, the ports, and
the layers below them.
"""
