"""Temporal activities: thin wrappers over `receipts` operations, and the agent handlers."""
