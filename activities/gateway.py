"""The AI gateway: every model call of an agent turn goes through it, so provider keys never
enter the sandbox and quota is seen by Receipt, not only by the command.

It runs inside worker-codex (`roles/delivery/serve.py`). A turn gets a `Grant`: a random token
scoped to its queue job, attempt and provider binding, and a Unix socket of its own, bound into
its sandbox only (`activities/sandbox_gateway.py`); both end when the turn does.

The gateway speaks the wire APIs agent CLIs use — OpenAI's Chat Completions and Responses,
Anthropic's Messages, streaming or not — and forwards each call to the binding's provider with
one of its credentials: the job's own (affinity) while it is usable, else the least busy, each
within its concurrency until the answer is sent. A credential refused for quota with a recovery
time rests until then and the call goes to another; when every one rests the command gets the
provider's 429 and the turn settles it as a placement delay. A 401 re-reads the key from its
file once, then fails the call on that credential alone (dropped for ten minutes only by
`activities/gateway_pool.py`'s rule); a 403 fails the call alone. Nothing of a prompt, an
answer or a key is logged; errors are redacted."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import shutil
import time
from collections.abc import Mapping
from datetime import UTC, datetime

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from activities.gateway_budget import Meter
from activities.gateway_grant import MAX_GRANT_BODY_BYTES, Grant
from activities.gateway_http import (
    MAX_BODY_VALUES,
    MAX_REQUEST_BYTES,
    Relay,
    Relayed,
    Server,
    bind,
    bounded_body,
    bounded_h11,
    call_of,
    error,
    may_hide_tools,
    recovery,
    redacted,
    same_token,
    socket_path,
    token_of,
    too_many_values,
    with_usage_asked,
    without_network_tools,
)
from activities.gateway_pool import ANTHROPIC_PATHS, OPENAI_PATHS, CredentialState, Pool, Slots
from activities.gateway_providers import Credential, Provider, warn_unusable
from activities.gateway_usage import Usage
from receipts import metrics
from receipts.refusal_log import RefusalLog
from receipts.waits import within

log = logging.getLogger("activities.gateway")

UPSTREAM_TIMEOUT = httpx.Timeout(30.0, read=300.0)
PASSED_REQUEST_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta")
MAX_CALLS_PER_GRANT = 8
MAX_CONNECTIONS = 256
SHORT_RESET_S = 2.0  # a credential free again this soon is waited for, once
DRAIN_S = 10.0  # a turn's calls still in flight when its command ends are waited for this long
SLOT_WAIT_S = 60.0  # a call waits this long for a credential's slot, then is told "busy" (429)
_REFRESHED = object()  # a refused credential's key was re-read: call with it again


class Gateway:
    """The gateway of one worker process: its providers, the grants of the turns it runs, and
    the meter of its organizations' daily token budgets (`activities/gateway_budget.py`)."""

    meter: Meter | None = None

    def __init__(self, providers: Mapping[str, Provider], http: httpx.AsyncClient) -> None:
        self.http = http
        self.grants: dict[str, Grant] = {}
        self.refusal_log = RefusalLog()  # a flood of refusals is counted, logged once in a while
        self.serving: dict[str, tuple[Server, asyncio.Task[None]]] = {}
        self.pools = {
            binding: Pool(
                provider,
                [CredentialState(c, Slots(c.max_concurrent)) for c in provider.credentials],
            )
            for binding, provider in providers.items()
        }
        log.info(
            "ai gateway ready",
            extra={"event": "gateway.ready", "bindings": sorted(self.pools)},
        )
        warn_unusable(providers)

    # --- grants ----------------------------------------------------------------------------

    def grant(
        self,
        *,
        job_id: str,
        attempt: int,
        agent_id: str,
        organization_id: str | None,
        binding: str,
    ) -> Grant:
        """A token for one turn's calls through `binding`, valid until `revoke`, and the socket
        that turn alone reaches it on (bound into its sandbox only): a token is refused on any
        other turn's socket, so a token that leaked serves no other job."""
        token = secrets.token_urlsafe(32)
        grant = Grant(token, job_id, attempt, agent_id, organization_id, binding, self.meter)
        grant.socket = socket_path()
        listening = bind(grant.socket)
        config = uvicorn.Config(
            self._app_for(grant),
            log_config=None,  # the role's logging stays as it is
            log_level="warning",
            access_log=False,
            lifespan="off",
            limit_concurrency=MAX_CONNECTIONS,
            # h11 bounds a request's head (16 KiB; httptools buffers headers without limit),
            # and MAX_CONNECTIONS open at once (idle ones took every descriptor of the worker).
            http=bounded_h11(MAX_CONNECTIONS, lambda: self._refused(grant, "connections", None)),
        )
        server = Server(config)
        task = asyncio.create_task(server.serve(sockets=[listening]), name=f"gateway:{job_id}")
        self.serving[grant.token] = (server, task)
        self.grants[grant.token] = grant
        return grant

    def revoke(self, grant: Grant) -> None:
        """End the turn's grant: its token opens nothing any more, its socket closes."""
        self.grants.pop(grant.token, None)
        if (pool := self.pools.get(grant.binding)) is not None:
            pool.affinity.pop(grant.job_id, None)  # the turn's: kept for it alone
        served = self.serving.pop(grant.token, None)
        if served is None:
            return
        server, task = served
        server.should_exit = True
        socket_dir = grant.socket.parent if grant.socket is not None else None
        if socket_dir is not None:
            task.add_done_callback(lambda _: shutil.rmtree(socket_dir, ignore_errors=True))

    async def drain(self, grant: Grant, timeout_s: float = DRAIN_S) -> None:
        """End the turn's grant (`revoke`: no new call), then wait up to `timeout_s` for its
        calls still in flight, so that what they cost is in its usage before the turn settles
        (a call the command left running when it exited is still billed). One still running
        then is logged and counted: its usage is not in the turn's."""
        self.revoke(grant)
        with contextlib.suppress(TimeoutError):
            await within(grant.idle.wait(), timeout_s)
        if grant.in_flight > 0:
            metrics.GATEWAY_USAGE_UNSETTLED.labels(grant.binding).inc(grant.in_flight)
            log.warning(
                "a turn's model calls were still running when it settled; their usage is not in "
                "its summary",
                extra={"event": "gateway.usage_unsettled", "binding": grant.binding,
                       "jobId": grant.job_id, "inFlight": grant.in_flight},
            )  # fmt: skip

    async def close(self) -> None:
        """Revoke every grant and wait for their sockets to close."""
        tasks = [task for _, task in self.serving.values()]
        for grant in list(self.grants.values()):
            self.revoke(grant)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _app_for(self, grant: Grant) -> Starlette:
        async def endpoint(request: Request) -> Response:
            return await self._forward(request, grant)

        async def unknown(request: Request, exc: Exception) -> Response:
            # A path or method the gateway does not serve, answered as the binding's provider
            # shapes an error (Starlette's own answer is plain text), counted and logged.
            pool = self.pools.get(grant.binding)
            style = pool.provider.api if pool is not None else "openai"
            status = getattr(exc, "status_code", 404)
            allowed = ", ".join(f"POST {p}" for p in (*OPENAI_PATHS, *ANTHROPIC_PATHS))
            path = request.scope["path"]  # as the route saw it (see `_forward`)
            message = f"{request.method} {path} is not served; the gateway serves {allowed}"
            kind = "not_found_error" if status == 404 else "invalid_request_error"
            return self._refused(grant, "unknown_path", error(style, status, kind, message))

        paths = (*OPENAI_PATHS, *ANTHROPIC_PATHS)
        return Starlette(
            routes=[Route(path, endpoint, methods=["POST"]) for path in paths],
            exception_handlers={404: unknown, 405: unknown},
        )

    def _removed(self, grant: Grant, families: list[str]) -> None:
        """Network tools taken out of a call: counted by family, logged once per 10 s per turn."""
        for family in families:
            metrics.GATEWAY_TOOLS_REMOVED.labels(grant.binding, family).inc()
        if self.refusal_log.due("tools_removed", grant.job_id) is not None:
            log.info(
                "network tools taken out of a model call: %s",
                ", ".join(sorted(set(families))),
                extra={"event": "gateway.tools_removed", "binding": grant.binding,
                       "jobId": grant.job_id, "tools": sorted(set(families))},
            )  # fmt: skip

    def _refused(self, grant: Grant, reason: str, answer: Response | None) -> Response:
        """`answer`, a refusal of the gateway's own (not the provider's; None: a connection
        closed as it was made): counted by reason (`receipt_gateway_refused_total`), logged
        once per 10 s per turn and reason."""
        answer = answer or Response(status_code=503)
        metrics.GATEWAY_REFUSED.labels(grant.binding, reason).inc()
        if (unlogged := self.refusal_log.due(f"refused:{reason}", grant.job_id)) is not None:
            log.warning(
                "the gateway refused a call: %s",
                reason,
                extra={"event": "gateway.refused", "binding": grant.binding,
                       "jobId": grant.job_id, "reason": reason, "status": answer.status_code,
                       "unloggedSince": unlogged},
            )  # fmt: skip
        return answer

    def _token_refused(self, grant: Grant, style: str) -> Response:
        """401: the call's token is not its turn's, or the turn has ended."""
        answer = error(style, 401, "authentication_error", "the turn's token is not valid")
        return self._refused(grant, "token", answer)

    # --- one call --------------------------------------------------------------------------

    async def _forward(self, request: Request, grant: Grant) -> Response:
        path = request.scope["path"]  # the route's: `request.url`'s is rebuilt from the Host
        style = "anthropic" if path in ANTHROPIC_PATHS else "openai"
        if not same_token(token_of(request), grant.token) or grant.token not in self.grants:
            return self._token_refused(grant, style)
        pool = self.pools.get(grant.binding)
        dead = f"no provider is configured for binding {grant.binding!r}" if pool is None else None
        dead = dead or (pool.provider.dead if pool is not None else None)
        if dead is not None or pool is None:
            grant.dead_pool = dead
            return self._refused(
                grant, "no_pool", error(style, 503, "overloaded_error", dead or "")
            )
        if pool.provider.api != style:
            message = f"{grant.binding} speaks {pool.provider.api}"
            return self._refused(grant, "wrong_api", error(style, 404, "not_found_error", message))
        if self.meter is not None and (spent := await self.meter.refusal(grant, style)):
            return self._refused(grant, "budget", spent)
        # Checked after the budget's read (an await), with nothing awaited until `call_began`:
        # the calls that waited on that read do not all pass the cap together.
        if grant.in_flight >= MAX_CALLS_PER_GRANT:
            message = f"a turn has at most {MAX_CALLS_PER_GRANT} model calls in flight"
            return self._refused(grant, "in_flight", error(style, 429, "rate_limit_error", message))
        # Counted from before its body is read: a body still arriving is a call in flight too
        # (so a turn cannot hold more bodies in the worker's memory, nor calls at the provider).
        grant.call_began()
        relayed = False
        taken = 0

        def take(size: int) -> bool:
            nonlocal taken
            if not grant.take_body(size):
                return False
            taken += size
            return True

        try:
            try:
                body = await bounded_body(request, take)
            except ClientDisconnect:  # the command hung up mid-body: nobody to answer, no error
                return Response(status_code=499)  # (each was a traceback at ERROR, unbounded)
            if body is None:
                message = (
                    f"a request is at most {MAX_REQUEST_BYTES} bytes, and a turn's calls in "
                    f"flight hold at most {MAX_GRANT_BODY_BYTES} together"
                )
                return self._refused(
                    grant, "too_large", error(style, 413, "request_too_large", message)
                )
            if too_many_values(body):
                message = f"a request holds at most {MAX_BODY_VALUES} JSON values"
                return self._refused(
                    grant, "too_many_values", error(style, 413, "request_too_large", message)
                )
            # The model decides which rest a 429 puts a credential to (per model): a call must
            # name it where the provider reads it, the body's top level.
            if (named := call_of(body)) is None:
                message = "the body must be a JSON object with a top-level string `model`"
                return self._refused(
                    grant, "no_model", error(style, 400, "invalid_request_error", message)
                )
            if unserved := named.unserved(path, pool.provider.network_tools):
                why = error(style, 400, "invalid_request_error", unserved[1])
                return self._refused(grant, unserved[0], why)
            if not pool.provider.network_tools:
                # The command's sandbox has no network; a provider-run MCP client or fetcher
                # would carry what the command wrote to any host. Agent CLIs offer web search
                # by default, so the tools are taken out rather than the call refused; a body
                # naming such a key twice is written again from its parse, whatever it names.
                if (remote := named.network_tools) or may_hide_tools(body):
                    body = without_network_tools(body)
                if remote:
                    self._removed(grant, remote)
            if named.stream is True and pool.provider.stream_usage:
                body = with_usage_asked(path, body)  # else OpenAI streams none: counted as zero
            model = named.model
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in PASSED_REQUEST_HEADERS
            }
            answer = await self._send_with_a_credential(
                pool, grant, path, body, headers, style, model
            )
            if isinstance(answer, Relayed):  # its body is held until the answer is sent
                answer.release = functools.partial(grant.give_back, answer.release, taken)
                relayed = True
            return answer
        finally:
            if not relayed:
                grant.body_bytes -= taken
                grant.call_ended()

    async def _send_with_a_credential(
        self,
        pool: Pool,
        grant: Grant,
        path: str,
        body: bytes,
        headers: dict[str, str],
        style: str,
        model: str,
    ) -> Response:
        """The call on one credential after another: a resting one (for `model`) is skipped, a
        refused one set aside; a reset a moment away is waited for once."""
        tried, waited, slot_by = set[int](), False, time.monotonic() + SLOT_WAIT_S
        pool.called_by(grant.organization_id)
        while True:
            now = datetime.now(UTC)
            index = pool.choose(grant.job_id, now, tried, model)
            if index is None:
                soon = pool.next_reset(now, model)
                if soon is not None and soon <= SHORT_RESET_S and not waited:
                    waited = True
                    tried.clear()
                    await asyncio.sleep(soon)
                    continue
                return self._exhausted(pool, grant, style, now, model)
            tried.add(index)
            state, org = pool.states[index], grant.organization_id or ""
            elsewhere = functools.partial(pool.free_elsewhere, tried, now, model)
            if not await state.slots.acquire(org, slot_by - time.monotonic(), elsewhere):
                if time.monotonic() < slot_by:  # another credential's slot is free: take it
                    tried.discard(index)
                    continue
                message = f"every credential of {grant.binding!r} is busy; try again"
                return self._refused(
                    grant, "busy", error(style, 429, "rate_limit_error", message, 1)
                )
            answer: Response | object | None = None
            try:
                if grant.token not in self.grants:  # the turn ended while the call waited
                    return self._token_refused(grant, style)
                answer = await self._call(pool, state, grant, path, body, headers, style, model)
            finally:
                if not isinstance(answer, Relayed):  # a relayed answer frees them once sent
                    state.slots.release(org)
            if isinstance(answer, Response):
                return answer
            if answer is _REFRESHED:
                tried.discard(index)  # its key changed in its file: once more with the new one

    def _exhausted(
        self, pool: Pool, grant: Grant, style: str, now: datetime, model: str
    ) -> Response:
        resting = pool.resting(now, model)
        if not resting:
            grant.dead_pool = f"every credential of {grant.binding!r} was refused"
            answer = error(style, 503, "overloaded_error", grant.dead_pool)
            return self._refused(grant, "no_credential", answer)
        until = min(resting)
        grant.met_quota(model, until)
        metrics.GATEWAY_QUOTA.labels(grant.binding).inc()
        log.warning(
            "a turn's provider pool is exhausted until %s",
            until.isoformat(),
            extra={"event": "gateway.quota", "binding": grant.binding, "jobId": grant.job_id},
        )
        wait_s = max(1, int((until - now).total_seconds() + 0.999))
        return error(
            style, 429, "rate_limit_error", f"quota exhausted until {until.isoformat()}", wait_s
        )

    async def _call(
        self,
        pool: Pool,
        state: CredentialState,
        grant: Grant,
        path: str,
        body: bytes,
        headers: dict[str, str],
        style: str,
        model: str,
    ) -> Response | object | None:
        """Send the call with `state`'s credential; None when it should go to another one,
        `_REFRESHED` when it should go to this one again (its key was re-read). A `_Relayed`
        answer holds the credential's slot and the grant's call until its body is sent."""
        provider, credential = pool.provider, state.credential
        url = provider.base_url + (path.removeprefix("/v1") if style == "openai" else path)
        auth = (
            {"authorization": f"Bearer {credential.key}"}
            if style == "openai"
            else {"x-api-key": str(credential.key)}
        )
        upstream_request = self.http.build_request(
            "POST",
            url,
            content=body,
            headers={**headers, **auth, "accept-encoding": "identity"},
            timeout=UPSTREAM_TIMEOUT,
        )
        started = time.monotonic()
        try:
            upstream = await self.http.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            late = isinstance(exc, httpx.TimeoutException)  # reached, but no answer in time
            why = "did not answer in time" if late else f"could not be reached: {exc}"
            grant.count("timeout" if late else "unreachable", Usage())
            message = redacted(f"the provider {why}", credential)
            return error(style, 504 if late else 502, "api_error", message)
        relayed = False
        try:
            status = upstream.status_code
            if status == 401 or (status == 429 and recovery(upstream) is not None):
                await upstream.aread()
                return self._set_aside(pool, state, upstream, credential, (grant, path, model))
            state.answered()
            if status < 400:
                grant.served(model)  # recovered: a later failure is the command's own
            grant.calls += 1
            relay = Relay(upstream, started, grant.count, style, len(body), str(credential.key))
            answer = Relayed(relay, functools.partial(grant.ended_on, state.slots))
            relayed = True
            return answer
        finally:
            if not relayed:
                await upstream.aclose()

    def _set_aside(
        self,
        pool: Pool,
        state: CredentialState,
        upstream: httpx.Response,
        used: Credential,
        call: tuple[Grant, str, str],
    ) -> object | None:
        """A 429 with a recovery time rests `state` for the call's model; a 401 re-reads its key
        once, else fails the call on it and may drop it (`activities/gateway_pool.py`)."""
        (grant, path, model), now = call, datetime.now(UTC)
        binding, credential = pool.provider.id, state.credential.id
        if upstream.status_code == 429:
            state.answered()  # refused for quota: the key authenticates
            if (until := recovery(upstream)) is not None:  # `_call` sets aside such a 429 only
                state.rest(model, until, now)
            log.info(
                "a credential rests until the provider's reset",
                extra={"event": "gateway.credential_resting", "binding": binding,
                       "credential": credential, "model": model, "until": str(until)},
            )  # fmt: skip
            return None
        if state.credential is not used:  # another call refreshed it meanwhile
            return _REFRESHED
        fresh = state.credential.reread()
        if fresh is not None:
            state.credential = fresh
            state.answered()  # a new key: the old one's refusals are not its own
            log.info(
                "a refused credential's key changed in its file; refreshed",
                extra={"event": "gateway.credential_refreshed", "binding": binding,
                       "credential": credential},
            )  # fmt: skip
            return _REFRESHED
        metrics.GATEWAY_UNAUTHORIZED.labels(binding, path).inc()
        if state.refused(path, grant.organization_id, now, len(pool.callers)):
            metrics.GATEWAY_CREDENTIALS_DEAD.labels(binding).inc()
            log.warning(
                "the provider refused a credential as unauthorized on every path, for several "
                "organizations; it is not used until %s",
                str(state.dropped_until),
                extra={"event": "gateway.credential_dropped", "binding": binding,
                       "credential": credential},
            )  # fmt: skip
        elif self.refusal_log.due("unauthorized", f"{binding}:{credential}:{path}") is not None:
            log.info(
                "the provider refused a credential as unauthorized for one call",
                extra={"event": "gateway.credential_refused", "binding": binding,
                       "credential": credential, "path": path, "jobId": grant.job_id},
            )  # fmt: skip
        return None
