"""Who a client is and what it may do: password file, ACL file, the authenticator."""
