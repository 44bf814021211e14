"""Comparing what two sides returned: layouts field by field with the first
divergence (:mod:`.dense`, :mod:`.sparse`), tensors bit pattern by bit pattern
with ULP figures and the first new NaN (:mod:`.bits`). Never a tolerance: equal
means equal bits. Imports: the data model and the port protocol's checks.
"""
