"""`python -m tools.chaos` (`make chaos`): real role processes under load and injected faults,
then an audit of the receipt chain.

Faults (seeded schedule): SIGKILL of a worker (restarted by the supervisor), SIGKILL of the
driver, SIGSTOP of a worker past its lease then SIGCONT (a zombie), a PostgreSQL restart (the
embedded server), a Temporal dev server restart (persistent SQLite), and a poison job whose
handler kills its own worker on every delivery. After the load the queue drains (bounded) and
the invariants are verified from the receipt chain alone.

Modules: `plan` (configuration, fault schedule, job mix), `state` (one run), `load` (enqueue,
abort, drain), `faults` (injection), `audit` (invariants, recovery times), `run` (the stack and
the report).
"""
