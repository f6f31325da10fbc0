"""Bridges to outside systems (MongoDB): broker-side durable subscribers, each with its own light-queue position."""
