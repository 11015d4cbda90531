"""The event loop's watch: a thread that notices when the loop is held.

Everything a role does shares one event loop: a handler's blocking call (`time.sleep`, a
blocking HTTP client, a long computation) inside an `async def` holds it, and with it every
heartbeat, lease renewal and answer of the process. Leases then expire and jobs are delivered
again, with nothing saying why. The watch asks the loop for a tick every half of
`RECEIPT_LOOP_STALL_MS`; a tick that does not come within `RECEIPT_LOOP_STALL_MS` is a stall:
logged `loop.stalled` (WARNING) once, with the loop thread's stack at that moment (what holds
it: the handler's frame is in it) and counted in `receipt_event_loop_stalls_total`; when the
loop answers again, `loop.stall_ended` says how long it was held, observed in
`receipt_event_loop_stall_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from receipts import metrics

log = logging.getLogger("roles.infra.loopwatch")

# The frames of the loop thread's stack that a stall's log line carries, innermost last.
STACK_FRAMES = 30


class LoopWatch:
    """Watches `loop` from a thread of its own; `stop()` ends the thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stall_s: float) -> None:
        self.loop = loop
        self.stall_s = stall_s
        self._stopped = threading.Event()
        self._loop_thread = threading.get_ident()  # made on the loop's thread
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)

    @classmethod
    def start(cls, stall_ms: int) -> LoopWatch | None:
        """Watch the running loop (called on it); None when `stall_ms` is 0 (no watch)."""
        if stall_ms <= 0:
            return None
        watch = cls(asyncio.get_running_loop(), stall_ms / 1000)
        watch._thread.start()
        return watch

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(self.stall_s / 2):
            ticked = threading.Event()
            asked = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(ticked.set)
            except RuntimeError:  # the loop is closed: nothing left to watch
                return
            if ticked.wait(self.stall_s):
                continue
            self._stalled(asked)
            while not ticked.wait(0.1):
                if self._stopped.is_set() or self.loop.is_closed():
                    return
            held = time.monotonic() - asked
            metrics.EVENT_LOOP_STALL_SECONDS.observe(held)
            log.warning(
                "the event loop answered again after %.1f s",
                held,
                extra={"event": "loop.stall_ended", "heldMs": round(held * 1000)},
            )

    def _stalled(self, asked: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        stack = traceback.extract_stack(frame)[-STACK_FRAMES:] if frame is not None else []
        where = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else None
        metrics.EVENT_LOOP_STALLS.inc()
        log.warning(
            "the event loop has not answered for %.1f s: blocking code holds it (at %s); "
            "heartbeats and leases wait behind it",
            time.monotonic() - asked,
            where,
            extra={
                "event": "loop.stalled",
                "stallMs": round(self.stall_s * 1000),
                "where": where,
                "stack": "".join(traceback.format_list(stack)),
            },
        )
