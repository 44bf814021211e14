"""Judging what ran: the summary table and its verdicts (:mod:`.summary`),
baselines of expected divergences (:mod:`.baseline`, :mod:`.judge`), the gate
and its shards (:mod:`.gate`), results files (:mod:`.results_file`), reproduce
commands that run when pasted (:mod:`.reproduce`) and provenance
(:mod:`.provenance`). Imports: the sides and below.
"""
