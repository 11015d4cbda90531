"""Process entry points: the roles, the recovery loops and the `receipt` command."""
