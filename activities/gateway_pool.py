"""The AI gateway's credential pools: which credential of a binding may take a call now (not
resting for the call's model, not dropped), which one a job prefers, and what a refusal by the
provider does to a credential (`activities/gateway.py` sends the calls).

A 429 with a recovery time rests the credential for the call's model until then. A 401 fails the
call on that credential alone: OpenAI answers 401 for a restricted key that lacks the scope of
one endpoint (`/v1/responses` while chat is allowed), and a tenant chooses its path and headers,
so one refusal says nothing of the key's other calls. The credential is dropped — for every call,
for DROP_COOLDOWN_S, then tried again — only when, with no other answer from it in between, the
provider refused it on every path its API serves and for calls of at least two organizations (a
tenant cannot make a working path answer 401, nor count for a second organization) — or of the
one organization that has called the binding, when only one has (a single-tenant install, or
an open API, where two would never be met and a revoked key would stay in the pool)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from activities.gateway_providers import Credential, Provider

OPENAI_PATHS = ("/v1/chat/completions", "/v1/responses")
ANTHROPIC_PATHS = ("/v1/messages",)
DROP_COOLDOWN_S = 600.0  # a dropped credential is tried again this long after (a key restored)
DROP_ORGANIZATIONS = 2  # organizations whose calls it was refused for before it is dropped
# A call waiting for one credential's slot looks this often whether another's is free (a long
# stream may hold the one it waits on).
LOOK_AGAIN_S = 0.5
SHARED_BY = 2  # organizations that called a credential before one may not hold its every slot


class Slots:
    """A credential's concurrency, shared by every organization's turns: at most `size` calls at
    once. A call that finds none free waits at most a given time; when one frees, the waiting
    call of the organization that holds the fewest goes first, among equals the organization
    served longest ago (then first come), so one organization's queued calls do not hold back
    another's (a FIFO served them all first; so did "first come among equals", since the
    organization whose call ended drops to the others' count at each release).

    Once a second organization has called the credential, one organization holds at most
    `size - 1` of its slots (`cap`): the waiters' order shares the slots that free, but a job's
    streams, long or read slowly, free none for as long as its turn runs, and every other
    organization's call waited out its time and was told "busy". A credential only one
    organization calls keeps every slot for it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held: Counter[str] = Counter()  # by organization
        self.waiting: list[tuple[str, asyncio.Future[None]]] = []
        # By organization, while it holds or waits: when it was last handed a slot (a count).
        self.served: dict[str, int] = {}
        self._handed = 0
        self.callers: set[str] = set()  # the organizations that called it, up to SHARED_BY

    @property
    def cap(self) -> int:
        """The slots one organization may hold."""
        return self.size - 1 if len(self.callers) >= SHARED_BY and self.size > 1 else self.size

    def _may_take(self, organization: str) -> bool:
        return self.busy < self.size and self.held[organization] < self.cap

    @property
    def busy(self) -> int:
        return self.held.total()

    @property
    def load(self) -> int:
        """Its calls, running and waiting: where a call waits least."""
        return self.busy + len(self.waiting)

    async def acquire(
        self, organization: str, timeout_s: float, leave: Callable[[], bool] = lambda: False
    ) -> bool:
        """A slot for a call of `organization`; False when none freed within `timeout_s`, or when
        `leave`, asked every LOOK_AGAIN_S of the wait, says the call may go elsewhere (another
        credential has a slot free). Until then the call keeps its place among the waiters."""
        if len(self.callers) < SHARED_BY:
            self.callers.add(organization)
        if self._may_take(organization) and not self._live_takers():
            self._take(organization)
            return True
        loop = asyncio.get_running_loop()
        waiter = (organization, loop.create_future())
        self.waiting.append(waiter)
        deadline = loop.time() + timeout_s
        try:
            while not waiter[1].done() and (left := deadline - loop.time()) > 0:
                await asyncio.wait((waiter[1],), timeout=min(left, LOOK_AGAIN_S))
                if not waiter[1].done() and leave():
                    break
            if waiter[1].done():  # handed over, as late as the wait's end: it is the call's
                return True
            waiter[1].cancel()
            return False
        except BaseException:
            if waiter[1].done() and not waiter[1].cancelled():
                self.release(organization)
            waiter[1].cancel()
            raise
        finally:
            if waiter in self.waiting:
                self.waiting.remove(waiter)
            self._hand_over()
            self._forget(organization)

    @property
    def free(self) -> bool:
        """Whether a call arriving now takes a slot at once. A waiter that gave up stays listed
        until its task runs: only a live one goes first, or a call would wait on a free slot that
        no release ever hands over (nor one waiting at its organization's `cap`)."""
        return self.busy < self.size and not self._live_takers()

    def _live_takers(self) -> list[tuple[str, asyncio.Future[None]]]:
        """The live waiters a free slot may be handed to (their organization under its cap)."""
        return [w for w in self.waiting if not w[1].done() and self.held[w[0]] < self.cap]

    def release(self, organization: str) -> None:
        self.held[organization] -= 1
        if self.held[organization] <= 0:
            del self.held[organization]
        self._hand_over()
        self._forget(organization)

    def _take(self, organization: str) -> None:
        self.held[organization] += 1
        self._handed += 1
        self.served[organization] = self._handed

    def _forget(self, organization: str) -> None:
        """An organization neither holding nor waiting is no longer remembered."""
        if not self.held[organization] and all(w[0] != organization for w in self.waiting):
            self.served.pop(organization, None)

    def _hand_over(self) -> None:
        """Free slots to the live waiters under their organization's cap, the organization
        holding the fewest first."""
        while self.busy < self.size:
            live = self._live_takers()
            if not live:
                return
            # The fewest held, then served longest ago, then the first come.
            waiter = min(live, key=lambda w: (self.held[w[0]], self.served.get(w[0], 0)))
            self.waiting.remove(waiter)
            self._take(waiter[0])
            waiter[1].set_result(None)


@dataclass
class CredentialState:
    """One credential of a pool as the gateway uses it now."""

    credential: Credential
    slots: Slots
    # Providers limit rates per model: a 429 for one model rests the credential for it alone,
    # so one tenant's model at its limit does not refuse another tenant's other model (a call
    # names its model at its body's top level, or is refused: `gateway_http.call_of`).
    resting_models: dict[str, datetime] = field(default_factory=dict)
    dropped_until: datetime | None = None
    # The 401s since its last other answer: on which paths, for which organizations.
    refused_paths: set[str] = field(default_factory=set)
    refused_for: set[str] = field(default_factory=set)

    @property
    def busy(self) -> int:
        return self.slots.busy

    def until(self, model: str) -> datetime | None:
        """When the credential may be used again for `model` (None: now)."""
        return self.resting_models.get(model)

    def dropped(self, now: datetime) -> bool:
        return self.dropped_until is not None and self.dropped_until > now

    def usable(self, now: datetime, model: str) -> bool:
        until = self.until(model)
        return not self.dropped(now) and (until is None or until <= now)

    def rest(self, model: str, until: datetime, now: datetime) -> None:
        """The provider refused it for quota on `model` until `until`."""
        for name in [m for m, t in self.resting_models.items() if t <= now]:
            del self.resting_models[name]  # past: the map holds only rests to come
        self.resting_models[model] = until

    def answered(self) -> None:
        """The provider answered it otherwise than 401: the key authenticates."""
        self.refused_paths.clear()
        self.refused_for.clear()

    def refused(
        self, path: str, organization: str | None, now: datetime, organizations: int
    ) -> bool:
        """The provider refused it (401) for a call on `path` of `organization`, on a binding
        `organizations` organizations have called; True when that drops it (the rule of this
        module's docstring)."""
        self.refused_paths.add(path)
        self.refused_for.add(organization or "")
        every_path = OPENAI_PATHS if path in OPENAI_PATHS else ANTHROPIC_PATHS
        needed = max(1, min(DROP_ORGANIZATIONS, organizations))
        if self.refused_paths < set(every_path) or len(self.refused_for) < needed:
            return False
        self.dropped_until = now + timedelta(seconds=DROP_COOLDOWN_S)
        self.answered()  # back from its rest, it must be refused all over again to drop again
        return True


@dataclass
class Pool:
    """A binding's provider and its credentials, with the credential each job last used."""

    provider: Provider
    states: list[CredentialState] = field(default_factory=list)
    affinity: dict[str, int] = field(default_factory=dict)
    # The organizations that have called it, up to DROP_ORGANIZATIONS (all a drop asks for).
    callers: set[str] = field(default_factory=set)

    def called_by(self, organization: str | None) -> None:
        if len(self.callers) < DROP_ORGANIZATIONS:
            self.callers.add(organization or "")

    def resting(self, now: datetime, model: str) -> list[datetime]:
        """When each credential at rest for quota for `model` (not dropped) may be used again."""
        return [t for s in self.states if not s.dropped(now) and (t := s.until(model)) is not None]

    def next_reset(self, now: datetime, model: str) -> float | None:
        """Seconds until the first resting credential may be used again (None: none rests)."""
        resting = self.resting(now, model)
        return max(0.0, (min(resting) - now).total_seconds()) if resting else None

    def free_elsewhere(self, tried: set[int], now: datetime, model: str) -> bool:
        """Whether a credential the call may still take (not in `tried`, which holds the one it
        waits on), usable for `model`, has a slot free now: a call waiting (behind a long
        stream) goes there instead. One that refused the call does not count: the call would
        only queue again, behind every call that came after it."""
        return any(
            i not in tried and s.usable(now, model) and s.slots.free
            for i, s in enumerate(self.states)
        )

    def choose(self, job_id: str, now: datetime, tried: set[int], model: str) -> int | None:
        """The credential for a call of `job_id`: the job's own while usable with a slot free,
        else one with a slot free before one without, then the least loaded (its calls running
        and waiting; ties from a place its id picks): a job's credential taken by other calls no
        longer holds it while another is idle, and a larger credential with a slot free is taken
        before a smaller one that is full. None when no untried one is usable."""
        usable = [i for i, s in enumerate(self.states) if s.usable(now, model) and i not in tried]
        if not usable:
            return None
        preferred = self.affinity.get(job_id)
        if (
            preferred in usable
            and self.states[preferred].slots.load < self.states[preferred].slots.size
        ):
            return preferred
        start = int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % len(self.states)
        usable.sort(
            key=lambda i: (
                not self.states[i].slots.free,
                self.states[i].slots.load,
                i != preferred,
                (i - start) % len(self.states),
            )
        )
        self.affinity[job_id] = usable[0]
        return usable[0]
