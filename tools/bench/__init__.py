"""`python -m tools.bench` (`make bench`): Receipt's speed against raw baselines, on a stack of
its own. tools/bench/README.md explains what is measured and quotes the tables of full runs.

* **API enqueue**: `POST /agents/codex/jobs` against a real `api` role process at 1 and 16
  concurrent clients, against the raw PostgreSQL transaction an enqueue performs
  (`receipts.enqueue.enqueue` called directly: the same SQL, no HTTP, no validation).
* **End to end**: `codex` jobs running `true` through the real `api`, `driver` and
  `worker-codex` role processes, and no-op jobs (an agent id with no handler: leased and settled
  `failed`, nothing run) through `api`, `driver` and `worker-chat`, as a burn-down and a steady
  stream, against three raw Temporal
  pipelines on the same server (`tools.bench.raw`): one workflow per job running one no-op
  activity on the worker queue, the same running `true` in Receipt's sandbox, and one workflow
  per job starting a child workflow that runs the no-op activity.
* **Recovery**: worker-codex SIGKILLed while a job's command runs, at the default leases, and
  started again; kill → takeover and kill → settled from the job's receipts.

Modules: `stats` (pure statistics), `config` (presets, targets), `results` (repetitions, ratios,
targets), `processes` (start/stop by PID, CPU meter), `load` (HTTP client, closed loop), `e2e`
and `run` (the scenarios and the stack), `recovery` (the SIGKILL), `raw` (the baselines'
workflows), `report` (table, chart), `profile` (py-spy).
"""
