"""Agent handlers: what a handler is given (`context.py`), the built-in handlers (`codex.py`,
`factory.py`, `monitor.py`, `agent_turn.py`) and the registry of them (`registry.py`); `fenced.py`
is all a handler may do to the receipts."""
