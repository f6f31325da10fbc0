"""The admin HTTP API (`/api/v1/`), the dashboard, the node figures behind both, and the ``twistmq-admin`` command."""
