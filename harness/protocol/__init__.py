"""What a port is. :mod:`.port`: the Python protocol (the levels, the methods
that enable each, the type checks on every value a port returns, what L3
compares). :mod:`.external` and :mod:`.external_sparse`: the client of a port
in another process (docs/external-port-protocol.md), also how an oracle of
another release is served. Imports: the data model and the kernels.
"""
