"""Receipt's store and domain: receipts in PostgreSQL, the job reducer and its operations."""
