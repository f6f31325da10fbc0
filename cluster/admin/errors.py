"""The error a ``twistmq-admin`` subcommand raises for a user mistake."""


class AdminError(Exception):
    """A user error: printed as ``twistmq-admin: error: MESSAGE``, exit status 2."""
