"""Infrastructure the roles share: database, embedded servers, Temporal client, tracing, logs, metrics."""
