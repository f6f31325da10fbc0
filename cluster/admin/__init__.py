"""The ``twistmq-admin`` command: operator tools (dev certificates, password file, ...)."""
