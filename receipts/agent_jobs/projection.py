"""The `agent_jobs` projection: each agent job's folded state, one row, written in the
transaction of its receipts (receipts/agent_jobs/lifecycle.py), rebuilt or verified from
`agent-jobs/*` by `receipt rebuild-projections` (receipts/assembly.py)."""

from __future__ import annotations

from receipts.agent_jobs.model import AgentJob, fold
from receipts.projections import Projection

AGENT_JOBS = Projection("agent_jobs", AgentJob, fold, "agent_job_upsert", noun="agent job ")
