"""Development tools: the bench and the chaos soak. Not part of the product: not in the wheel,
not in the `receipt` command; run through `make bench` / `make chaos` or `python -m tools.…`.
They import the product (`receipts`, `roles`); nothing outside `tools/` and `tests/` imports them.
"""
