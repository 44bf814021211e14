"""The nightly job (:mod:`.nightly`): every port at every level, the kill
matrix, explore and coverage, with its history (:mod:`.history`), and the
drift watch against newer upstream releases (:mod:`.drift`). Imports: search
and below.
"""
