"""Background agent jobs: the pure model (`model`), their transactions (`lifecycle`), the agents
registry (`registry`) and the turn protocol (`protocol`)."""
