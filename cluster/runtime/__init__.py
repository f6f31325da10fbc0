"""The process around a role: config and its documented defaults, service-tree building blocks,
listeners (and ``SO_REUSEPORT``), the HTTP site, the log, the collector's settings, the version."""
