"""MongoDB, shared by what uses it: the ``[mongodb]`` section and the process's one client, off the reactor.

``config`` holds ``MongoConfig`` (``uri``, ``database``, ``timeout``) and the start-time checks (``pymongo``
installed, the URI well formed); ``client`` holds ``MongoPool``, the service every ``pymongo`` call of the
process runs through. The users of MongoDB (the MQTT user/ACL source, bridges) get a ``MongoPool`` passed in.
"""
