"""The receipt command line: role entry, client commands, the one-command stack (receipt up)."""
