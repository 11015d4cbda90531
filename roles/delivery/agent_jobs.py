"""The agent-job dispatcher: settles finished turns, claims slots for waiting jobs, fails
unanswered ones past the input timeout. Woken by notices, backed by a periodic redrive."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from opentelemetry import trace

from activities.driver import callback_message_id, post_callback
from receipts import deliveries, metrics
from receipts.agent_jobs import claims, interventions, lifecycle
from receipts.agent_jobs import metrics as agent_metrics
from receipts.agent_jobs import reads as agent_reads
from receipts.agent_jobs.model import (
    SLOTS_PER_AGENT,
    STREAM_PREFIX,
    WAKEUP,
    agent_job_id_of_queue_job,
    session_stream,
)
from receipts.agent_jobs.registry import AgentJobSettings, RegistryError, load_registry
from receipts.errors import ReceiptError
from receipts.jobs import JOB_STREAM_PREFIX
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.notices import AGENT_JOBS, SETTLED_TYPES
from receipts.refusal_log import RefusalLog
from receipts.settings import Settings
from receipts.store import Store
from receipts.streams import dumps
from receipts.trace_context import job_trace
from receipts.waits import within

log = logging.getLogger("roles.delivery.agent_jobs")
_tracer = trace.get_tracer("receipt.agent_jobs")

MAX_IDLE_S = 60.0
AGENT_JOB_DISPATCHER_LOOP = "agent_job_dispatcher"  # the `loop` label of its failed passes
WAKEUP_POSTS_AT_ONCE = 8
WAKEUP_POST_WAIT_S = 1.0


@dataclass
class DispatchPass:
    """What one pass did."""

    settled: int = 0
    claimed: int = 0
    no_slot: int = 0
    held: int = 0  # the organization's turns fill its share of the codex workers
    timed_out: int = 0
    callbacks: int = 0
    failed: int = 0  # jobs whose step raised (logged; the pass went on)


class AgentJobDispatcher:
    """One pass (`run_once`): settle running jobs whose turn's queue job is terminal, fail
    waiting jobs past `RECEIPT_AGENT_JOB_INPUT_TIMEOUT_MS`, then claim ready jobs agent by agent
    while that agent has a free slot. `run` repeats it on every relevant notice, at the soonest
    `availableAt`, and at least every redrive interval."""

    name = "agent_job_dispatcher"

    def __init__(
        self,
        store: Store,
        listener: Listener | None,
        settings: AgentJobSettings | None = None,
        *,
        callbacks: Settings | None = None,
        http: httpx.AsyncClient | None = None,
        org_cap: int = 0,
    ) -> None:
        self.store = store
        self.listener = listener
        self.settings = settings or AgentJobSettings()
        # An organization's dispatch slots on the codex workers, where turns run
        # (`RECEIPT_ORG_MAX_RUNNING_PER_GROUP`; 0: no cap): a job is claimed only when its turn
        # can take one, so it never holds an agent slot while its turn waits for the cap.
        self.org_cap = org_cap
        self.holding = False  # the last pass held a job at its organization's cap
        self.held_log = RefusalLog()
        # Wakeups are also posted to the event callback URLs when both are given.
        self.callbacks = callbacks
        self.http = http
        self._posting: dict[tuple[str, str], asyncio.Task[bool]] = {}
        self._stop = asyncio.Event()  # `run`'s stop: set, no wakeup post is claimed any more
        self._posts_at_once = asyncio.Semaphore(WAKEUP_POSTS_AT_ONCE)
        self._gauged: set[str] = set()  # agents the running gauge last read above 0
        self._registry_ids: frozenset[str] = frozenset()
        self._registry_version: tuple[int, int] | None = None  # its file's mtime and size
        agent_metrics.AGENT_JOB_ACTIONS.labels("failed")  # from 0, for the alert's increase()

    async def run_once(self) -> DispatchPass:
        """One pass; each job in its own transaction, and a job whose step fails is logged and
        counted (`failed`) and passed over, so one failure stops nothing else."""
        started = time.monotonic()
        result = DispatchPass()
        for agent_job_id in await agent_reads.settled_turns(self.store):
            async with self._each(result, agent_job_id, "settle"):
                settled = await lifecycle.settle_turn(
                    self.store,
                    agent_job_id,
                    retry_base_ms=self.settings.retry_base_ms,
                    org_cap=self.org_cap,
                )
                if settled is not None:
                    result.settled += 1
                    agent_metrics.AGENT_JOB_TURNS_SETTLED.labels(settled.status).inc()
        if (timeout_ms := self.settings.input_timeout_ms) is not None:
            for agent_job_id in await agent_reads.input_overdue(self.store, timeout_ms):
                async with self._each(result, agent_job_id, "input_timeout"):
                    if await interventions.fail_overdue_input(
                        self.store, agent_job_id, timeout_ms=timeout_ms
                    ):
                        result.timed_out += 1
        full: set[tuple[str, str | None]] = set()
        for agent_job_id, agent_id, organization_id in await agent_reads.ready(self.store):
            slots = (agent_id, organization_id)
            if slots in full:
                result.no_slot += 1
                continue
            async with self._each(result, agent_job_id, "claim"):
                claimed = await claims.claim(
                    self.store,
                    agent_job_id,
                    agent_id,
                    org_cap=self.org_cap,
                    organization_id=organization_id,
                )
                if not isinstance(claimed, str):
                    result.claimed += 1
                elif claimed == lifecycle.ORGANIZATION_AT_CAP:
                    result.held += 1
                    self._held(agent_job_id, organization_id)
                elif await self._slots_full(*slots):
                    full.add(slots)
                    result.no_slot += 1
        self.holding = result.held > 0
        # Counted before the wakeups are posted: a failure there keeps what was committed.
        for action in ("settled", "claimed", "no_slot", "held", "timed_out", "failed"):
            if count := getattr(result, action):
                agent_metrics.AGENT_JOB_ACTIONS.labels(action).inc(count)
        if self.callbacks is not None and self.http is not None:
            result.callbacks = await self._post_wakeups(self.callbacks, self.http)
        await self._gauge_running()
        agent_metrics.AGENT_JOB_PASSES.observe(time.monotonic() - started)
        if result.settled or result.claimed or result.timed_out:
            log.info(
                "agent-job dispatch pass",
                extra={
                    "event": "agent_job.dispatch_pass",
                    "settled": result.settled,
                    "claimed": result.claimed,
                    "noSlot": result.no_slot,
                    "held": result.held,
                    "timedOut": result.timed_out,
                },
            )
        return result

    async def _gauge_running(self) -> None:
        """`receipt_agent_jobs_running{agent}`: the slots in use per agent, summed over the
        organizations; an agent with none left reads 0 (not its last count). An agent the
        registry does not name is `other`: a tenant chooses `agentId` (the api checks it only
        where it reads the registry), and each label value is a series for good."""
        running: dict[str, int] = dict.fromkeys(self._gauged, 0)
        rows = await agent_reads.running_by_agent(self.store)
        registered = self._registered() if rows else frozenset()
        for _, agent, count in rows:
            label = agent if agent in registered else metrics.OTHER_AGENT
            running[label] = running.get(label, 0) + count
        for agent, count in running.items():
            agent_metrics.AGENT_JOBS_RUNNING.labels(agent).set(count)
        self._gauged = {agent for agent, count in running.items() if count}

    def _registered(self) -> frozenset[str]:
        """The registry's agent ids, read again when its file changed; none when it is not
        configured or cannot be read (the turns report that)."""
        path = self.settings.agents_file
        try:
            found = path.stat() if path is not None else None
        except OSError:
            found = None
        version = (found.st_mtime_ns, found.st_size) if found is not None else None
        if version != self._registry_version:
            try:
                self._registry_ids = frozenset(load_registry(path).agents)
            except RegistryError:
                self._registry_ids = frozenset()
            self._registry_version = version
        return self._registry_ids

    @contextlib.asynccontextmanager
    async def _each(
        self, result: DispatchPass, agent_job_id: str, step: str
    ) -> AsyncIterator[None]:
        """One job's step of a pass: what it raises is logged and counted, and the pass goes on
        (a job that fails every time must not hold back every other tenant's claims)."""
        try:
            yield
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            result.failed += 1
            log.warning(
                "agent-job dispatch step failed; the pass goes on",
                exc_info=not isinstance(exc, ReceiptError),
                extra={"event": "agent_job.dispatch_step_failed", "agentJobId": agent_job_id,
                       "step": step, "error": str(exc)},
            )  # fmt: skip

    async def _post_wakeups(self, settings: Settings, http: httpx.AsyncClient) -> int:
        """Post `{event: "session.wakeup", sessionId, wakeup}` once per wakeup and URL (claimed
        in `callback_posts`, as job callbacks are; a failed post is tried again by a later pass,
        5 times at most). A callback failure never changes a job.

        The posts run beside the passes, WAKEUP_POSTS_AT_ONCE at a time: a pass waits for them
        at most WAKEUP_POST_WAIT_S (what it returns counts those posted by then). Posted one by
        one inside the pass, a receiver that never answers held every pass 5 s per wakeup (100
        per URL): no claim, settlement or input timeout for any tenant meanwhile."""
        if self._stop.is_set():  # the role drains: the other drivers post what is owed
            return 0
        started: list[asyncio.Task[bool]] = []
        for url in settings.callback_urls:
            for source_id, session_id, seq in await agent_reads.unposted_wakeups(self.store, url):
                key = (source_id, url)
                if key in self._posting:
                    continue  # still being posted by an earlier pass
                task = asyncio.create_task(
                    self._post_wakeup(settings, http, url, source_id, session_id, seq)
                )
                self._posting[key] = task
                task.add_done_callback(functools.partial(self._posted, key))
                started.append(task)
        if not started:
            return 0
        done, _ = await asyncio.wait(started, timeout=WAKEUP_POST_WAIT_S)
        return sum(1 for t in done if not t.cancelled() and t.exception() is None and t.result())

    async def _post_wakeup(
        self,
        settings: Settings,
        http: httpx.AsyncClient,
        url: str,
        source_id: str,
        session_id: str,
        seq: int,
    ) -> bool:
        # The post and its log line are in the agent job's trace (its create's, which its turns
        # share): its `traceparent` names this span, as a queue job's callback's does.
        with contextlib.ExitStack() as in_trace:
            try:
                async with self._posts_at_once:
                    if self._stop.is_set():  # drained while it waited its turn: left to others
                        return False
                    if not await deliveries.claim_callback(self.store, source_id, WAKEUP, url):
                        return False
                    found = await self.store.read_stream(session_stream(session_id), seq - 1, 1)
                    if not found or found[0].type != WAKEUP:
                        return False
                    agent_job_id = str(found[0].data.get("agentJobId"))
                    woken = await lifecycle.get(self.store, agent_job_id)
                    in_trace.enter_context(job_trace(woken.traceparent if woken else None))
                    in_trace.enter_context(
                        _tracer.start_as_current_span(
                            "receipt.wakeup_callback",
                            kind=trace.SpanKind.CLIENT,
                            attributes={"receipt.agent_job_id": agent_job_id},
                        )
                    )
                    body = dumps(
                        {"event": WAKEUP, "sessionId": session_id, "wakeup": found[0].to_json()}
                    ).encode()
                    message_id = callback_message_id(f"{source_id}:{url}")
                    error = await post_callback(http, settings, url, message_id, body)
                    status = "posted" if error is None else "failed"
                    await deliveries.callback_result(
                        self.store, source_id, WAKEUP, url, status, error
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the claimed post is tried again later
                status, error = "failed", f"{type(exc).__name__}: {exc}"
            if error is not None:
                trace.get_current_span().set_status(trace.StatusCode.ERROR, error)
            agent_metrics.AGENT_JOB_WAKEUP_CALLBACKS.labels(status).inc()
            log.log(
                logging.INFO if error is None else logging.WARNING,
                "wakeup callback %s",
                status,
                extra={"event": "agent_job.wakeup_callback", "sourceId": source_id, "error": error},
            )
            return error is None

    def _posted(self, key: tuple[str, str], _: asyncio.Task[bool]) -> None:
        self._posting.pop(key, None)

    async def close(self) -> None:
        """Stop the wakeup posts still running (each claimed post is tried again later)."""
        for task in list(self._posting.values()):
            task.cancel()
        await asyncio.gather(*self._posting.values(), return_exceptions=True)

    def _held(self, agent_job_id: str, organization_id: str | None) -> None:
        """A claim held at its organization's cap: every pass tries it again, so it is logged
        once in a while per organization (each is counted in the pass's `held`)."""
        if (unlogged := self.held_log.due("held", organization_id or "")) is not None:
            log.info(
                "agent job held: its organization's jobs fill its share of the codex workers",
                extra={"event": "agent_job.held_back", "agentJobId": agent_job_id,
                       "organizationId": organization_id, "unloggedSince": unlogged},
            )  # fmt: skip

    async def _slots_full(self, agent_id: str, organization_id: str | None) -> bool:
        async with self.store.transaction() as tx:
            return await claims.running_count(tx, agent_id, organization_id) >= SLOTS_PER_AGENT

    async def _timeout(self) -> float:
        interval = self.settings.redrive_interval_ms / 1000
        soonest = await agent_reads.next_available_at(self.store)
        if soonest is None:
            return min(interval, MAX_IDLE_S)
        delay = (soonest - await self.store.now()).total_seconds()
        return min(interval, MAX_IDLE_S, max(0.05, delay))

    def wakes_on(self, notice: Notice) -> bool:
        """A notice that may change what a pass would do: any agent-job append, or a terminal
        receipt of a turn's queue job (its agent job's settlement is due); while a job is held
        at its organization's cap, any job's terminal receipt (one may give a slot back)."""
        if notice is RECONNECTED or notice.stream.startswith(STREAM_PREFIX):
            return True
        if notice.stream.startswith(JOB_STREAM_PREFIX):
            if not SETTLED_TYPES.intersection(notice.types):
                return False
            job_id = notice.stream[len(JOB_STREAM_PREFIX) :]
            return self.holding or agent_job_id_of_queue_job(job_id) is not None
        return False

    async def _pass(self) -> None:
        try:
            await self.run_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the dispatcher outlives any failing pass; the next one retries
            metrics.LOOP_FAILED.labels(AGENT_JOB_DISPATCHER_LOOP).inc()
            log.warning(
                "agent-job dispatch pass failed",
                exc_info=not isinstance(exc, ReceiptError),
                extra={"event": "agent_job.dispatch_failed", "error": str(exc)},
            )

    async def run(self, stop: asyncio.Event | None = None, grace_s: float = 0.0) -> None:
        """Dispatch until cancelled or `stop` is set (needs a listener). Once `stop` is set (the
        role drains) it makes no more passes and claims no more wakeup posts, and returns when
        the posts in flight are recorded, or after `grace_s` (those still in flight then are
        cut: logged `agent_job.wakeup_drain_cut`, their claims lapse and another driver posts
        them again). Cut at once, a post its receiver was answering was heard twice, the second
        time 30 s later."""
        assert self.listener is not None
        metrics.LOOP_FAILED.labels(AGENT_JOB_DISPATCHER_LOOP)  # from 0, for the alert's increase()
        if stop is not None:
            self._stop = stop
        try:
            async with self.listener.subscribe(channel=AGENT_JOBS) as notices:
                while not self._stop.is_set():
                    await self._pass()
                    # The next pass is due at a deadline read once per pass: the notices of
                    # other work (every append of every job) neither query the database nor put
                    # it off.
                    deadline = time.monotonic() + await self._timeout_or_default()
                    await self._woken_or_stopped(notices, deadline)
            await self._drain(grace_s)
        finally:
            await self.close()

    async def _woken_or_stopped(self, notices: asyncio.Queue[Notice], deadline: float) -> None:
        """`_woken`, or sooner when `stop` is set."""
        if self._stop.is_set():
            return
        waking = asyncio.create_task(self._woken(notices, deadline))
        stopping = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({waking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waking.cancel()
            stopping.cancel()
            await asyncio.gather(waking, stopping, return_exceptions=True)

    async def _drain(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the wakeup posts in flight to be answered and recorded."""
        if not self._posting:
            return
        _, cut = await asyncio.wait(set(self._posting.values()), timeout=grace_s)
        if cut:
            log.warning(
                "wakeup posts still in flight at the end of the shutdown grace are cut; their "
                "claims lapse and they are posted again",
                extra={"event": "agent_job.wakeup_drain_cut", "posts": len(cut), "graceS": grace_s},
            )

    async def _woken(self, notices: asyncio.Queue[Notice], deadline: float) -> None:
        """Return at the first notice that `wakes_on` (a burst of them coalesced into one pass),
        or at `deadline` (monotonic)."""
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                notice = await within(notices.get(), remaining)
            except TimeoutError:
                return
            woke = self.wakes_on(notice)
            while not notices.empty():
                woke = self.wakes_on(notices.get_nowait()) or woke
            if woke:
                return

    async def _timeout_or_default(self) -> float:
        try:
            return await self._timeout()
        except ReceiptError:
            return self.settings.redrive_interval_ms / 1000
