"""Temporal workflow definitions: deterministic, no I/O (every effect is an activity)."""
