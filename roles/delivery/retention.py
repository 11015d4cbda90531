"""The retention loop (worker-control): `RECEIPT_RETENTION` runs `receipt prune` periodically.

Single flight across processes: a pass first takes a transaction-scoped advisory lock in a
transaction of its own and holds that transaction open (idle, no snapshot kept) while its
batches run on other connections; a pass in another process that cannot take the lock does
nothing. A process that dies mid-pass drops its connection and with it the lock. Behind a
transaction-mode pooler the lock transaction pins one server connection, as any transaction does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from receipts import durations, metrics, retention
from receipts.store import Store, translate_errors
from roles.infra.settings import LoopSettings

log = logging.getLogger("roles.delivery.retention")

DEFAULT_INTERVAL_MS = 60_000
# One pass removes at most this many batches; the next tick goes on (so a first pass over a
# long history does not hold the single-flight lock for hours without a log line).
MAX_BATCHES_PER_PASS = 100


class RetentionLoop:
    """Prune terminal jobs settled longer ago than `older_than`, one process at a time."""

    name = "retention"

    def __init__(
        self,
        store: Store,
        older_than: timedelta,
        *,
        batch: int = retention.DEFAULT_BATCH,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        max_batches: int = MAX_BATCHES_PER_PASS,
        callback_urls: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.older_than = older_than
        self.batch = batch
        self.interval_ms = interval_ms
        self.max_batches = max_batches
        self.callback_urls = list(callback_urls)  # a wakeup owing a post to one keeps its job
        self._schedules_after = ""  # where the last pass left the schedules' compaction

    @classmethod
    def from_settings(
        cls,
        store: Store,
        retention_setting: str,
        loops: LoopSettings,
        callback_urls: Sequence[str] = (),
    ) -> RetentionLoop | None:
        """The loop `RECEIPT_RETENTION` asks for (None for `0`: keep everything); its interval is
        RECEIPT_RETENTION_INTERVAL_MS (`LoopSettings`). A bad value raises naming the setting
        (the start check refuses it before: `Settings` validates it)."""
        older_than = durations.parse_duration(retention_setting, name="RECEIPT_RETENTION")
        if older_than is None:
            return None
        return cls(
            store, older_than, interval_ms=loops.retention_interval_ms, callback_urls=callback_urls
        )

    async def run_once(self) -> retention.PruneResult | None:
        """One pass: prune if no other process is pruning (then None: this pass was skipped).
        A pass that fails mid-way still logs and counts what its committed batches removed,
        then raises (the loop logs `loop.failed`)."""
        result = retention.PruneResult(schedules_after=self._schedules_after)
        with translate_errors():
            async with self.store.transaction() as lock:
                if not await retention.take_pass_lock(lock):
                    log.debug(
                        "retention pass skipped: another process is pruning",
                        extra={"event": "retention.skipped"},
                    )
                    metrics.RETENTION_SKIPPED.inc()
                    return None
                try:
                    await retention.prune(
                        self.store,
                        self.older_than,
                        batch=self.batch,
                        max_batches=self.max_batches,
                        schedules_after=self._schedules_after,
                        callback_urls=self.callback_urls,
                        into=result,
                    )
                except BaseException:
                    self._report(result)
                    raise
                finally:
                    self._schedules_after = result.schedules_after
        if result.batches >= self.max_batches:
            metrics.RETENTION_BEHIND.inc()
            log.warning(
                "a retention pass stopped at its budget of %d batches with more to prune",
                self.max_batches,
                extra={"event": "retention.behind", "batches": result.batches},
            )
        self._report(result)
        return result

    def _report(self, result: retention.PruneResult) -> None:
        """Log `retention.pruned` and count the rows removed, per table."""
        log.log(
            logging.INFO if result.removed else logging.DEBUG,
            "retention pass: %s",
            result.summary(),
            extra={
                "event": "retention.pruned",
                "cutoff": result.cutoff.isoformat() if result.cutoff else None,
                "batches": result.batches,
                **{f"removed_{k}": v for k, v in result.removed.items()},
            },
        )
        for table, rows in result.removed.items():
            metrics.RETENTION_PRUNED.labels(table).inc(rows)
