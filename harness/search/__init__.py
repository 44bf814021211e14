"""Searching for what the suites miss.

The mutant kill matrix (:mod:`.mutants`); shrinking a failing case
(:mod:`.shrink`); exploring for new failures with hypothesis (:mod:`.explore`:
its input space :mod:`.explore_strategies`, one property's search
:mod:`.explore_search`, its finds :mod:`.explore_finds` and results
:mod:`.explore_results`); coverage of the planner's decisions (the features
:mod:`.coverage`, measuring them :mod:`.coverage_measuring`, the targets
:mod:`.coverage_targets` and the verdict :mod:`.coverage_verdicts`, the
sparse path's :mod:`.sparse_coverage`). Imports: verdicts and below.
"""
