"""The composition root: roles, and the implementations of the store interface (``store.api``).

Today: ``local_store.LocalStore`` (the store in-process), ``loopback_store.LoopbackStore``
(any store behind the RPC codec, for the contract tests) and ``store_codec`` (the
msgpack mapping of the interface's types, the payload codec of the store RPC).
"""
