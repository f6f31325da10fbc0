"""The role compositions: ``node``, ``broker``, ``proxy`` (one module each, none imports another),
``common`` (what they share) and ``table`` (the roles table ``cluster.tap`` turns into subcommands)."""
