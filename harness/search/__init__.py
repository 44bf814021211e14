"""Searching for what the suites miss: the mutant kill matrix
(:mod:`.mutants`), shrinking a failing case (:mod:`.shrink`), exploring for new
failures (:mod:`.explore`) and coverage of the planner's decisions
(:mod:`.coverage`, :mod:`.sparse_coverage`). Imports: verdicts and below.
"""
