"""Background agent jobs: the pure model (`model`) and lifecycle decisions (`decisions`), their
transactions (`lifecycle`), the agents registry (`registry`) and the turn protocol (`protocol`)."""
