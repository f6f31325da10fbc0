"""The store interface across processes: ``RemoteStore`` (a proxy's view of one broker group over RPC),
``StoreServer`` (the broker side), their msgpack ``codec``, ``RoutedStore`` over several groups, and the
proxy's forwarding of native requests."""
