"""Factory objectives: a written goal planned into a task graph, reconciled into jobs."""
