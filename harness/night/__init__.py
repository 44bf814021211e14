"""The nightly job and the drift watch.

Running a night (:mod:`.nightly`): every port at every level, the kill
matrix, explore and coverage; what a night is and its verdict (:mod:`.data`);
which baseline judges each port (:mod:`.baselines`); its folder, lock and
files (:mod:`.folder`); merging shards (:mod:`.shards`); the GPU section's
report (:mod:`.gpu_report`); the history across nights (:mod:`.history`).
The drift watch against newer upstream releases (:mod:`.drift`). Imports:
search and below.
"""
