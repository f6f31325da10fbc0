"""Developer and operator tools that run outside a role: the local-cluster launcher (``./dev cluster``),
test certificates and the password-file editor (both behind ``twistmq-admin``)."""
