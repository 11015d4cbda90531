"""The delivery control plane: dispatcher, driver starter, recovery loops, Temporal workers."""
