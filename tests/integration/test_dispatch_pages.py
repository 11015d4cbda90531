"""The dispatcher's rescan and the queued redrive read the queue a page at a time.

Through `dispatch_queue` (migrations/0008) every pass ranked and sorted the whole queue, whatever
it then acted on: 80-130 ms at 10 500 queued jobs, every 15 s in every role. A pass now reads one
page after a cursor (migrations/0026 `dispatch_page`), and the pages of one lap pick exactly the
jobs the whole-queue rule picked: held back by the same caps, shares that straddle pages
included."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from receipts import assembly, deliveries, fairness
from receipts.settings import Settings
from receipts.sql import query
from receipts.store import Store
from roles.infra.db import migrate_url
from tests.integration.test_bounded_reads import analyzed, read_of

# The default shares (codex 3, chat 12, control 6), in SQL: an organization's backlog of 8 000
# codex jobs behind the 3 it runs, 40 organizations with 50 chat jobs each (12 started, holding
# their slots and delivered), 500 jobs of no organization (delivered), and some interleaved
# small organizations with a delayed job, an abort and one never-dispatched job each.
QUEUE = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'b' || lpad(g::text, 5, '0'), 1, 'org-big', 'codex', 'chat', 'codex',
       CASE WHEN g <= 3 THEN 'running' ELSE 'queued' END, CASE WHEN g <= 3 THEN 1 ELSE 0 END, 3,
       now() - make_interval(secs => 20000 - g), now() - make_interval(secs => 20000 - g), '{{}}',
       'receipt-codex'
FROM generate_series(1, {big} + 3) g;
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'o' || o || '-' || g, 1, 'org-' || o, 'chatty', 'chat', 'factory.task.run', 'queued', 0, 3,
       now() - make_interval(secs => 15000 - g * 10 - o),
       now() - make_interval(secs => 15000 - g * 10 - o), '{{}}', 'receipt-chat'
FROM generate_series(1, {orgs}) o, generate_series(1, 50) g;
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'w' || g, 1, NULL, 'watchdog', 'chat', 'factory.task.run', 'queued', 0, 3,
       now() - make_interval(secs => 13000 - g), now() - make_interval(secs => 13000 - g), '{{}}',
       'receipt-control'
FROM generate_series(1, {watchdog}) g;
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, abort_requested, available_at, created_at, updated_at, state,
                  worker_queue)
SELECT 's' || g || '-' || k, 1, 'org-s' || (g % 7), 'codex', 'chat', 'codex', 'queued', 0, 3,
       k = 2, CASE WHEN k = 1 THEN now() + interval '1 hour' END,
       now() - make_interval(secs => 19000 - g * 10 - k),
       now() - make_interval(secs => 19000 - g * 10 - k), '{{}}', 'receipt-codex'
FROM generate_series(1, 30) g, generate_series(1, 3) k;
INSERT INTO dispatch_slots (job_id, organization_id, worker_queue)
SELECT job_id, organization_id, worker_queue FROM jobs
WHERE job_id IN ('b00001', 'b00002', 'b00003')
   OR (job_id LIKE 'o%' AND split_part(job_id, '-', 2)::int <= 12);
INSERT INTO deliveries (job_id, generation, workflow_id)
SELECT job_id, 0, job_id FROM dispatch_slots UNION SELECT job_id, 0, job_id FROM jobs
WHERE job_id LIKE 'w%';
"""
# Beside it, in the small queue: an organization with jobs on two capped queues (codex and chat,
# interleaved), holding chat slots only, whose waiting chat jobs come before its codex ones; and
# jobs of no organization on a capped queue never dispatched. A share is an organization on one
# queue: its slots and its waiting jobs on the other queue count nothing toward it.
TWO_QUEUES = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'm' || g, 1, 'org-m', CASE WHEN g % 2 = 0 THEN 'codex' ELSE 'chatty' END, 'chat',
       CASE WHEN g % 2 = 0 THEN 'codex' ELSE 'factory.task.run' END,
       CASE WHEN g % 2 = 1 AND g >= 21 THEN 'running' ELSE 'queued' END,
       CASE WHEN g % 2 = 1 AND g >= 21 THEN 1 ELSE 0 END, 3,
       now() - make_interval(secs => 17000 - g * 10), now() - make_interval(secs => 17000 - g * 10),
       '{}', CASE WHEN g % 2 = 0 THEN 'receipt-codex' ELSE 'receipt-chat' END
FROM generate_series(1, 30) g;
INSERT INTO dispatch_slots (job_id, organization_id, worker_queue)
SELECT job_id, organization_id, worker_queue FROM jobs WHERE job_id LIKE 'm%' AND status = 'running';
INSERT INTO deliveries (job_id, generation, workflow_id)
SELECT job_id, 0, job_id FROM jobs WHERE job_id LIKE 'm%' AND status = 'running';
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 'n' || g, 1, NULL, 'watchdog', 'chat', 'factory.task.run', 'queued', 0, 3,
       now() - make_interval(secs => 16000 - g * 7), now() - make_interval(secs => 16000 - g * 7),
       '{}', 'receipt-control'
FROM generate_series(1, 10) g;
"""
DEFAULT_CAPS = fairness.caps(Settings())
NO_CAPS = fairness.caps(Settings(RECEIPT_ORG_MAX_RUNNING_PER_GROUP="0"))


async def _seeded(make_database: Callable[[], str], more: str = "", **sizes: int) -> str:
    url = make_database()
    await migrate_url(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUEUE.format(**sizes).encode())
        if more:
            conn.execute(more.encode())
        conn.execute(b"VACUUM ANALYZE")
    return url


@pytest.fixture(scope="module")
async def small(make_database: Callable[[], str]) -> AsyncIterator[tuple[Store, str]]:
    url = await _seeded(make_database, TWO_QUEUES, big=40, orgs=6, watchdog=20)
    store = await assembly.open_store(url, min_size=1, max_size=2)
    yield store, url
    await store.close()


# The never-dispatched jobs the whole-queue rule (`dispatch_queue`, 0008) does not hold back.
WHOLE_QUEUE = b"""
SELECT q.job_id FROM dispatch_queue(%(queues)s::text[], %(caps)s::integer[]) q
WHERE NOT q.held_back AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.job_id = q.job_id)"""
# What the redrive takes by that rule: the jobs it does not hold back not dispatched within the
# cooldown (`REDRIVE_COOLDOWN_MS`).
REDRIVE_COOLDOWN_MS = 30_000
WHOLE_QUEUE_REDRIVE = b"""
SELECT q.job_id FROM dispatch_queue(%(queues)s::text[], %(caps)s::integer[]) q
WHERE NOT q.held_back AND NOT EXISTS (
    SELECT 1 FROM deliveries d WHERE d.job_id = q.job_id AND d.dispatched_at > now() - interval '30 s')"""
SCANS = ["undelivered_queued", "redrive_candidates"]


def rows(url: str, statement: bytes, params: dict[str, Any] | None = None) -> set[str]:
    with psycopg.connect(url) as conn:
        return {row[0] for row in conn.execute(statement, params).fetchall()}


def wanted(url: str, scan: str, caps: dict[str, Any]) -> set[str]:
    """What a lap of `scan` picks by the whole-queue rule."""
    return rows(url, WHOLE_QUEUE if scan == "undelivered_queued" else WHOLE_QUEUE_REDRIVE, caps)


async def lap(
    store: Store, scan: str, caps: dict[str, Any], limit: int, page: int | None = None
) -> list[str]:
    """The jobs one lap of `scan`'s pages picks, from the oldest to the newest following
    `next` (at most 500 pages); every page reads at most its size and picks at most `limit`."""
    picked: list[str] = []
    after = deliveries.START
    for _ in range(500):
        if scan == "undelivered_queued":
            got = await deliveries.undelivered_queued(
                store, limit=limit, page=page, caps=caps, after=after
            )
        else:
            got = await deliveries.redrive_candidates(
                store,
                min_age_ms=0,
                cooldown_ms=REDRIVE_COOLDOWN_MS,
                limit=limit,
                page=page,
                caps=caps,
                after=after,
            )
            assert len(got.seqs) == len(got.attempts) == len(got.job_ids)
        assert got.read <= (page or limit) and len(got.job_ids) <= limit
        picked += got.job_ids
        after = got.next
        if got.last:
            return picked
    raise AssertionError(f"no lap's end in 500 pages: {len(picked)} picked")


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("caps", [DEFAULT_CAPS, NO_CAPS], ids=["capped", "uncapped"])
@pytest.mark.parametrize("page", [1, 7, 50, 1_000])
async def test_one_lap_of_pages_picks_what_the_whole_queue_rule_picks(
    small: tuple[Store, str], caps: dict[str, Any], page: int, scan: str
) -> None:
    """Pages of any size, shares straddling them: a lap of the rescan's pages (from the oldest
    to the newest, following `next`) picks exactly the never-dispatched jobs `dispatch_queue`
    does not hold back, each once, and every page reads at most its size. The redrive's, those
    not dispatched within its cooldown: a page with fewer candidates than its limit (the
    others dispatched within the cooldown) goes on after it, not from the oldest again."""
    store, url = small
    expected = wanted(url, scan, caps)
    assert expected  # the seed leaves some to pick, capped or not
    assert sorted(await lap(store, scan, caps, page)) == sorted(expected)


@pytest.mark.parametrize("scan", SCANS)
async def test_a_page_cut_by_its_limit_goes_on_from_the_last_job_it_picked(
    small: tuple[Store, str], scan: str
) -> None:
    """The redrive reads a page larger than the candidates it takes (the rescan may): when the
    limit cuts the page, the next page starts after the last job taken, so none of the page is
    passed over."""
    store, url = small
    assert sorted(await lap(store, scan, NO_CAPS, 3, 50)) == sorted(wanted(url, scan, NO_CAPS))


# Jobs enqueued together share their creation time (one transaction's clock): 40 of three
# organizations, written in the reverse of their ids' order; 8 dispatched a minute ago (the
# redrive's, past its cooldown), 8 just now.
TIED = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, created_at, updated_at, state, worker_queue)
SELECT 't' || lpad(g::text, 3, '0'), 1, 'org-t' || (g % 3), 'codex', 'chat', 'codex', 'queued',
       0, 3, now() - interval '1 hour', now() - interval '1 hour', '{}', 'receipt-codex'
FROM generate_series(1, 40) g ORDER BY g DESC;
INSERT INTO deliveries (job_id, generation, workflow_id, dispatched_at)
SELECT job_id, 0, job_id, CASE WHEN right(job_id, 1) IN ('0', '5') THEN now() - interval '1 minute'
                               ELSE now() END
FROM jobs WHERE right(job_id, 1) IN ('0', '5', '1', '6');
"""


@pytest.fixture(scope="module")
async def tied(make_database: Callable[[], str]) -> AsyncIterator[tuple[Store, str]]:
    url = make_database()
    await migrate_url(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TIED.encode())
        conn.execute(b"VACUUM ANALYZE")
    store = await assembly.open_store(url, min_size=1, max_size=2)
    yield store, url
    await store.close()


@pytest.mark.parametrize("caps", [DEFAULT_CAPS, NO_CAPS], ids=["capped", "uncapped"])
@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize(("limit", "page"), [(1, 1), (7, 7), (2, 7)])
async def test_jobs_created_at_one_instant_are_each_picked_once_in_a_lap(
    tied: tuple[Store, str], caps: dict[str, Any], scan: str, limit: int, page: int
) -> None:
    """The cursor is a job's creation time and its id: a page that ends among jobs created
    at one instant goes on after the last of them it read or picked (by id), so a lap picks
    each job once, and ends."""
    store, url = tied
    expected = wanted(url, scan, caps)
    assert expected
    if caps is NO_CAPS:
        assert len(expected) == (24 if scan == "undelivered_queued" else 32)
    assert sorted(await lap(store, scan, caps, limit, page)) == sorted(expected)


@pytest.fixture(scope="module")
async def queue_of_10k(make_database: Callable[[], str]) -> str:
    return await _seeded(make_database, big=8_000, orgs=40, watchdog=410)


@pytest.mark.parametrize("name", ["undelivered_queued", "redrive_candidates"])
@pytest.mark.parametrize("after_job", [None, "b04000", "b07999", "o20-30"])
async def test_a_pass_reads_its_page_not_the_queue(
    queue_of_10k: str, name: str, after_job: str | None
) -> None:
    """10 500 queued jobs: a pass read every one of them twice (21 003 rows of `jobs`) and sorted
    them; a page of 500 now reads 500, and the capped shares it meets a few of their jobs
    before it (at most their cap each) and their slots, wherever the page starts."""
    after: dict[str, Any] = {"after_created_at": None, "after_job_id": after_job}
    with psycopg.connect(queue_of_10k) as conn:
        assert conn.execute(b"SELECT count(*) FROM jobs WHERE status = 'queued'").fetchone() == (
            10_500,
        )
        if after_job is not None:
            row = conn.execute(b"SELECT created_at FROM jobs WHERE job_id = %s", (after_job,))
            after["after_created_at"] = row.fetchone()[0]  # type: ignore[index]
    params = {"limit": 500, "page": 500, "min_age_ms": 30_000, "cooldown_ms": 15_000}
    plan = analyzed(queue_of_10k, name, {**params, **after, **DEFAULT_CAPS})
    read = read_of(plan, "jobs")
    # The page, and per capped share met (40 here at most): at most its cap of jobs before the
    # page (and what the walk to them passes: its other queue's jobs, slot holders) and its
    # slots. The whole queue read 21 003.
    assert read <= 2_000, read
    assert not [n for n in plan if n["Node Type"] == "Seq Scan" and n["Relation Name"] == "jobs"]


# The jobs the whole-queue rule holds back: what the held-back gauge counted through it.
WHOLE_QUEUE_HELD = b"""
SELECT count(*) FROM dispatch_queue(%(queues)s::text[], %(caps)s::integer[]) q WHERE q.held_back"""
# Beside the seed: jobs of a share routed before jobs were (no worker queue), a share whose
# organization holds more slots than its cap (its cap lowered since) and a delayed job there.
MORE_SHARES = """
INSERT INTO jobs (job_id, seq, organization_id, agent_id, lane, kind, status, attempt,
                  max_attempts, available_at, created_at, updated_at, state, worker_queue)
SELECT 'x' || g, 1, 'org-x', 'codex', 'chat', 'codex', CASE WHEN g <= 5 THEN 'leased' ELSE
       'queued' END, 0, 3, CASE WHEN g = 9 THEN now() + interval '1 hour' END,
       now() - make_interval(secs => 900 - g), now() - make_interval(secs => 900 - g), '{}',
       CASE WHEN g % 4 = 0 THEN NULL ELSE 'receipt-codex' END
FROM generate_series(1, 20) g;
INSERT INTO dispatch_slots (job_id, organization_id, worker_queue)
SELECT job_id, organization_id, 'receipt-codex' FROM jobs WHERE job_id IN ('x1', 'x2', 'x3', 'x5');
"""


@pytest.mark.parametrize("setting", ["", "0", "1", "codex=5,chat=0", "40"])
async def test_the_held_back_gauge_counts_what_the_whole_queue_rule_holds_back(
    small: tuple[Store, str], setting: str
) -> None:
    """The gauge counts per capped share instead of ranking the queue: on a mixed queue (shares
    straddling their caps, delayed jobs, aborts, slot holders, no organization, no worker queue,
    an organization over its cap) and under any caps it counts what `dispatch_queue` holds
    back."""
    store, url = small
    caps = fairness.caps(Settings(RECEIPT_ORG_MAX_RUNNING_PER_GROUP=setting))
    with psycopg.connect(url) as conn:
        before = conn.execute(query("dispatch_held_back").encode(), caps).fetchone()
        assert before == conn.execute(WHOLE_QUEUE_HELD, caps).fetchone()
        conn.execute(MORE_SHARES.encode())
        whole = conn.execute(WHOLE_QUEUE_HELD, caps).fetchone()
        assert conn.execute(query("dispatch_held_back").encode(), caps).fetchone() == whole
        conn.rollback()
    assert whole is not None and before is not None
    if setting not in ("0", "40"):
        assert whole[0] > before[0] > 0  # the seed holds some back, the new shares more
    held = await fairness.held_back(store, Settings(RECEIPT_ORG_MAX_RUNNING_PER_GROUP=setting))
    assert held == before[0]


async def test_the_held_back_gauge_reads_the_capped_shares_waiting_jobs_once(
    queue_of_10k: str,
) -> None:
    """10 500 queued jobs: the 5 s gauge read them twice (21 003 rows of `jobs`, the active jobs
    for the slots they hold) and sorted them to rank every share. It now reads the capped
    shares' queued jobs once, unsorted, and each share's slots."""
    plan = analyzed(queue_of_10k, "dispatch_held_back", DEFAULT_CAPS)
    read = read_of(plan, "jobs")
    # The 10 500 queued jobs once (10 030 of capped shares counted) and the 483 slots' jobs, one
    # probe each.
    assert read <= 11_000, read
    assert not [n for n in plan if n["Node Type"] in ("Sort", "Incremental Sort", "WindowAgg")]
