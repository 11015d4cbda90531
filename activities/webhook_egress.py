"""Where an organization's webhook may post (SSRF): https to public addresses only, unless the
operator allow-listed the host.

A tenant chooses the URL, and the deliverer posts from inside the cluster, so the URL must not
reach what only the cluster can: loopback, private networks, link-local (cloud metadata at
169.254.169.254), CGNAT, multicast, unspecified, IPv6 unique-local and link-local addresses.
The host is resolved and every address it resolves to is checked, at create (the API answers
422 naming `url`) and again at each delivery, which then connects to the address it checked
(the URL's host, an internationalised name in its IDNA form, goes in the Host header and, over
TLS, in SNI and the certificate check): a name that resolves elsewhere between the check and the
connect (DNS rebinding) cannot redirect it. Redirects are not followed. Hosts on
`RECEIPT_WEBHOOK_ALLOWED_HOSTS` are exempt (the operator's own receivers, plain http allowed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from receipts import metrics
from receipts.waits import within
from receipts.webhooks import WebhookSettings, ascii_url

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Ranges `is_private` and friends do not name in every Python version.
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_ULA = ipaddress.ip_network("fc00::/7")
_LINK_LOCAL_V6 = ipaddress.ip_network("fe80::/10")
_SITE_LOCAL_V6 = ipaddress.ip_network("fec0::/10")
# IETF protocol assignments (192.0.0.192 is a cloud's metadata service): not every Python's
# tables call the whole block non-global.
_PROTOCOL_ASSIGNMENTS = ipaddress.ip_network("192.0.0.0/24")
# NAT64's well-known prefix: the last 32 bits are the IPv4 address a translator reaches.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


# A resolver that does not answer must not hold a create (or a delivery) for long.
RESOLVE_TIMEOUT_S = 5.0
LOOKUPS_PER_OWNER = 4
MAX_LOOKUPS = 1024  # lookups still running, of every organization (each holds a thread)
MAX_ANSWER_BYTES = 4096  # of a receiver's answer, read and dropped

log = logging.getLogger("activities.webhook_egress")


class EgressRefused(Exception):
    """The URL may not be posted to; the message says why (it names `url`)."""


def refused_reason(address: str | IPAddress) -> str | None:
    """Why a webhook may not connect to `address` (`loopback`, `private`, …), or None for a
    public address. An IPv4 address mapped into IPv6 is judged as the IPv4 address."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv6 address that carries an IPv4 one (mapped, 6to4, Teredo's client, NAT64)
        # reaches that address: it is judged as it.
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif (embedded := _embedded_ipv4(ip)) is not None and refused_reason(embedded):
            return refused_reason(embedded)
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local or ip in _LINK_LOCAL_V6:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip in _CGNAT:
        return "CGNAT"
    if ip in _PROTOCOL_ASSIGNMENTS:
        return "reserved"
    if ip in _ULA:
        return "unique-local"
    if ip in _SITE_LOCAL_V6:
        return "site-local"
    if ip.is_private:
        return "private"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's address (the server's is public by design)
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class Target:
    """A URL cleared for posting; `address` is the checked address to connect to (None: the
    host is allow-listed, connect as the URL says)."""

    url: str
    host: str
    address: str | None = None


class _Lookups:
    """Name lookups, each on a thread of its own (not the event loop's default executor, whose
    few threads psycopg's connects share, nor one pool all organizations share): a lookup the
    caller gave up on at RESOLVE_TIMEOUT_S keeps its thread until the system resolver gives up,
    often far later. One lookup per host at a time, however many deliveries ask for it; at most
    LOOKUPS_PER_OWNER hosts of one organization still resolving, so a tenant whose hosts' DNS
    never answers holds a few threads and no other organization's lookup waits behind them; and
    at most MAX_LOOKUPS in all (then refused, as past an organization's share)."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, int], concurrent.futures.Future[list[Any]]] = {}
        self._owners: dict[str, set[tuple[str, int]]] = {}
        self._lock = threading.Lock()

    def start(
        self, host: str, port: int, owner: str | None
    ) -> concurrent.futures.Future[list[Any]]:
        key = (host, port)
        with self._lock:
            held = self._owners.get(owner, set()) if owner is not None else set()
            lookup = self._running.get(key)
            if lookup is None:
                self._refuse_past_shares(host, held)
                lookup = self._running[key] = concurrent.futures.Future()
                thread = threading.Thread(
                    target=self._look_up, args=(key, lookup), name="webhook-dns", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as exc:  # at the process's limit of threads (pids)
                    del self._running[key]  # else resolving for good: waited on, never ending
                    metrics.WEBHOOK_LOOKUPS_REFUSED.inc()
                    raise EgressRefused(
                        f"{host!r} is not looked up: no thread for it ({exc}); try again later"
                    ) from None
            if owner is not None:
                self._owners[owner] = held | {key}
            return lookup

    def _refuse_past_shares(self, host: str, held: set[tuple[str, int]]) -> None:
        if len(held) >= LOOKUPS_PER_OWNER:
            metrics.WEBHOOK_LOOKUPS_REFUSED.inc()
            raise EgressRefused(
                f"{len(held)} of this organization's webhook hosts are still "
                f"resolving; {host!r} is not looked up until one ends (try again later)"
            )
        if len(self._running) >= MAX_LOOKUPS:
            metrics.WEBHOOK_LOOKUPS_REFUSED.inc()
            raise EgressRefused(
                f"{len(self._running)} webhook hosts are still resolving; {host!r} is not "
                "looked up until one ends (try again later)"
            )

    def _look_up(self, key: tuple[str, int], lookup: concurrent.futures.Future[list[Any]]) -> None:
        """On the lookup's own thread: resolve, let go of the key (before answering: a caller
        told the host does not resolve may ask again at once), then answer its callers."""
        host, port = key
        infos: list[Any] = []
        failure: Exception | None = None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except Exception as exc:  # the lookup's outcome, answered to its callers
            failure = exc
        finally:
            with self._lock:
                self._running.pop(key, None)
                for owner, held in list(self._owners.items()):
                    held.discard(key)
                    if not held:
                        del self._owners[owner]
        if failure is not None:
            lookup.set_exception(failure)
        else:
            lookup.set_result(infos)


_lookups = _Lookups()


async def resolve(host: str, port: int, owner: str | None = None) -> list[str]:
    """Every address `host` resolves to (an address literal: itself); `owner` (an organization)
    counts against its lookups still running (`_Lookups`)."""
    waiting = asyncio.wrap_future(_lookups.start(host, port, owner))
    waiting.add_done_callback(_retrieved)
    # Shielded: a caller that gives up does not cancel the lookup other callers share.
    infos = await asyncio.shield(waiting)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _retrieved(waiting: asyncio.Future[list[Any]]) -> None:
    """Read a lookup's failure, so one no caller waited for any more is not logged as lost."""
    if not waiting.cancelled():
        waiting.exception()


async def check(url: str, settings: WebhookSettings, owner: str | None = None) -> Target:
    """Clear `url` for a post, or raise `EgressRefused` saying why. An internationalised host
    is judged, and posted to, in its IDNA form (a webhook stored before create normalised it).
    `owner`, the organization whose webhook it is, bounds its lookups still running."""
    try:
        url = ascii_url(url)
    except ValueError as exc:
        raise EgressRefused(f"url's host is not a valid internationalised name: {exc}") from None
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        raise EgressRefused("url has no host")
    if host in settings.hosts:
        return Target(url, host)
    if parts.scheme != "https":
        raise EgressRefused(
            "url must be https (plain http only to a host on RECEIPT_WEBHOOK_ALLOWED_HOSTS)"
        )
    port = parts.port or 443
    try:
        addresses = await within(resolve(host, port, owner), RESOLVE_TIMEOUT_S)
    except TimeoutError:
        raise EgressRefused(
            f"url's host {host!r} did not resolve within {RESOLVE_TIMEOUT_S:g} s"
        ) from None
    except (OSError, UnicodeError) as exc:
        raise EgressRefused(f"url's host {host!r} does not resolve: {exc}") from None
    if not addresses:
        raise EgressRefused(f"url's host {host!r} does not resolve")
    for address in addresses:
        reason = refused_reason(address)
        if reason is not None:
            # The address is logged, never answered: a tenant must not map the cluster's
            # names to its private addresses through the refusals.
            log.warning(
                "webhook url refused: its host resolves to a %s address",
                reason,
                extra={"event": "webhook.egress_refused", "host": host, "address": address},
            )
            raise EgressRefused(
                f"url's host {host!r} resolves to a {reason} address; a webhook may reach "
                "public addresses only unless its host is on RECEIPT_WEBHOOK_ALLOWED_HOSTS"
            )
    return Target(url, host, addresses[0])


async def post(
    client: httpx.AsyncClient,
    target: Target,
    headers: dict[str, str],
    content: bytes,
    timeout_s: float,
) -> httpx.Response:
    """POST `content` to the target, connecting to its checked address when it has one. The
    answer's body is read up to MAX_ANSWER_BYTES and dropped: a receiver cannot make the
    deliverer hold more of it (the caller bounds the whole exchange in time)."""
    if target.address is None:
        request = client.build_request(
            "POST", target.url, content=content, headers=headers, timeout=timeout_s
        )
        return await _sent(client, request)
    parts = urlsplit(target.url)
    ip = ipaddress.ip_address(target.address)
    literal = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    named = f"[{target.host}]" if ":" in target.host else target.host  # an IPv6 literal
    host_header = f"{named}:{parts.port}" if parts.port else named
    request = client.build_request(
        "POST",
        urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")),
        content=content,
        # `connection: close`: the client pools connections by address, not by TLS name, so a
        # connection kept for one host would carry the next post to another host at the same
        # address without that host's certificate ever being checked. None is kept.
        headers={**headers, "host": host_header, "connection": "close"},
        timeout=timeout_s,
        # The TLS name (SNI and the certificate's check) is the URL's host, not the address.
        extensions={"sni_hostname": target.host},
    )
    return await _sent(client, request)


async def _sent(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    response = await client.send(request, follow_redirects=False, stream=True)
    try:
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read >= MAX_ANSWER_BYTES:
                break
    finally:
        await response.aclose()
    return response
