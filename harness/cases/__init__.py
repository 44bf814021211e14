"""Cases: what the harness compares the sides on.

The case-file format and its checks (:mod:`.files`, :mod:`.fields`, the sparse
items :mod:`.sparse_inputs`), the generators of heterogeneous batches
(:mod:`.generate` over :mod:`.sweep_families` and :mod:`.coverage_families`,
L3 :mod:`.prefill_generate`, :mod:`.sparse_generate`, merge inputs :mod:`.merge`) and
the named suites built from them (:mod:`.suites`). A suite is a pure
function of its name and size. Imports: the data model and the kernels' input
types only.
"""
