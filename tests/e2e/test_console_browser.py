"""The console in a real browser (Playwright driving Debian's Chromium) against a real api process.

No worker runs: the test writes the receipts a worker would (lease, heartbeat, progress, cancel)
through `receipts.operations`, and watches the page follow them live. Where no Chromium is
installed the tests skip, saying so loudly (`.ci/run` installs it with apt).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from receipts import operations
from receipts.store import Store
from tests.integration.api_support import (
    AS_A,
    TOKEN_A,
    RunningApi,
    enqueue_body,
    rid,
    running_api,
)
from tests.integration.helpers import new_id

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("RECEIPT_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = os.environ.get("RECEIPT_SCREENSHOTS_DIR")

if not shutil.which(CHROMIUM):
    pytest.skip(
        f"NO CHROMIUM at {CHROMIUM}: the console's browser tests are SKIPPED "
        "(apt-get install chromium, or set RECEIPT_TEST_CHROMIUM)",
        allow_module_level=True,
    )

from playwright.async_api import Browser, Page, async_playwright, expect  # noqa: E402


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("console"))) as api:
        yield api


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


async def signed_in_page(browser: Browser, api: RunningApi, foreign: list[str]) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    page.on(
        "request",
        lambda request: None if request.url.startswith(api.url) else foreign.append(request.url),
    )
    await page.goto(f"{api.url}/console")
    await expect(page).to_have_url(f"{api.url}/console/login")
    await page.fill('input[name="token"]', TOKEN_A)
    await page.click('button[type="submit"]')
    await expect(page).to_have_url(f"{api.url}/console/jobs")
    # The browser holds a session's id, never the token.
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "receipt_console"]
    assert cookie["value"] != TOKEN_A and cookie.get("httpOnly") is True
    assert cookie.get("sameSite") == "Strict"
    return page


async def shot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        await page.screenshot(path=str(Path(SCREENSHOTS) / name), full_page=True)


async def enqueue(api: RunningApi, agent: str) -> str:
    job_id = new_id()
    async with httpx.AsyncClient(base_url=api.url) as client:
        answer = await client.post(
            f"/agents/{agent}/jobs",
            json=enqueue_body(jobId=job_id, payload_extra={"task": {"command": ["make", "test"]}}),
            headers=AS_A,
        )
    assert answer.status_code == 202, answer.text
    return job_id


async def test_sign_in_filter_watch_live_output_and_abort(
    api: RunningApi, store: Store, browser: Browser
) -> None:
    agent = "codex"
    job_id = await enqueue(api, agent)
    other = await enqueue(api, f"agent-{new_id()}")
    worker = f"{job_id}:attempt:1/1"
    assert (
        await operations.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=60_000)
    ).ok
    assert (
        await operations.heartbeat(store, rid(job_id), worker_id=worker, attempt=1, lease_ms=60_000)
    ).ok
    foreign: list[str] = []
    page = await signed_in_page(browser, api, foreign)

    await page.select_option('select[name="status"]', "running")
    await page.fill('input[name="agentId"]', agent)
    await page.click("#filters button[type=submit]")
    await expect(page.get_by_role("link", name=job_id)).to_be_visible()
    await expect(page.get_by_role("link", name=other)).to_have_count(0)
    await shot(page, "console-jobs.png")

    await page.get_by_role("link", name=job_id).click()
    await expect(page.locator("#status")).to_have_text("running")
    await page.wait_for_timeout(300)  # the event stream connects
    for n in range(3):
        await operations.progress(
            store, rid(job_id), worker_id=worker, attempt=1, data={"lines": [f"step {n} done"]}
        )
    await expect(page.locator("#output")).to_contain_text("step 2 done")
    await expect(page.locator("#timeline")).to_contain_text("job.progress")
    await shot(page, "console-job.png")

    await page.fill('input[name="reason"]', "operator stop")
    await page.get_by_role("button", name="Abort").click()
    await expect(page.locator(".notice")).to_have_text("abort appended")
    job = await store.get_job(rid(job_id))
    assert job is not None and job.abort_requested and job.abort_reason == "operator stop"
    await page.wait_for_timeout(300)
    assert (
        await operations.cancel(store, rid(job_id), worker_id=worker, attempt=1, reason="aborted")
    ).ok
    await expect(page.locator("#status")).to_have_text("canceled")
    assert foreign == []


async def test_retry_a_failed_job_from_the_failed_work_page(
    api: RunningApi, store: Store, browser: Browser
) -> None:
    agent = f"agent-{new_id()}"
    job_id = await enqueue(api, agent)
    assert (await operations.fail_undeliverable(store, rid(job_id), error=f"{agent} exploded")).ok
    foreign: list[str] = []
    page = await signed_in_page(browser, api, foreign)
    await page.get_by_role("link", name="Failed work").click()
    await page.fill('input[name="agentId"]', agent)
    await page.get_by_role("button", name="Filter").click()
    row = page.locator("tr", has_text=f"{agent} exploded")
    await expect(row).to_be_visible()
    await shot(page, "console-failed.png")
    await row.get_by_role("link", name="1").click()
    await page.get_by_role("link", name=job_id).click()
    await page.get_by_role("button", name="Retry").click()
    await expect(page.locator(".notice")).to_have_text(f"retry of {job_id}")
    await expect(page.locator("#status")).to_have_text("queued")
    old = await store.get_job(rid(job_id))
    assert old is not None and old.status == "failed" and old.retried_as is not None
    assert old.retried_as in page.url
    await asyncio.sleep(0)
    assert foreign == []


async def test_the_api_reference_renders_offline(api: RunningApi, browser: Browser) -> None:
    page = await browser.new_page()
    foreign: list[str] = []
    page.on(
        "request",
        lambda request: None if request.url.startswith(api.url) else foreign.append(request.url),
    )
    await page.goto(f"{api.url}/docs")
    await expect(page.locator(".swagger-ui .title")).to_contain_text(
        "Receipt API", timeout=20_000
    )  # the document grew (every body and answer named): its first render takes longer loaded
    await expect(page.get_by_text("/agents/{agentId}/jobs").first).to_be_visible()
    assert foreign == []


async def test_answer_an_agent_jobs_question(
    api: RunningApi, store: Store, browser: Browser
) -> None:
    from receipts.agent_jobs import lifecycle
    from tests.integration.test_agent_jobs import current, dispatcher, play_turn, request

    agent = f"agent-{new_id()}"
    job = (await lifecycle.create(store, request(agent)))[0]
    await dispatcher(store).run_once()
    await play_turn(
        store,
        await current(store, job.agent_job_id),
        {"outcome": "needs_input", "question": "Deploy to staging first?", "toolCallId": "c-1"},
    )
    await dispatcher(store).run_once()
    foreign: list[str] = []
    page = await signed_in_page(browser, api, foreign)
    await page.get_by_role("link", name="Agent jobs").click()
    await page.fill('input[name="agentId"]', agent)
    await page.get_by_role("button", name="Filter").click()
    await page.get_by_role("link", name=job.agent_job_id).click()
    await expect(page.locator("#question")).to_have_text("Deploy to staging first?")
    await shot(page, "console-agent-job.png")
    await page.fill('textarea[name="answer"]', "yes, staging first")
    await page.get_by_role("button", name="Answer").click()
    # The answer is recorded; the dispatcher continues the job when a slot is free.
    await expect(page.locator(".notice")).to_contain_text("answered; the job is waiting_on_user")
    answered = await current(store, job.agent_job_id)
    assert answered.answer == {"toolCallId": "c-1", "answer": "yes, staging first"}
    await dispatcher(store).run_once()
    await page.reload()
    await expect(page.locator("#status")).to_have_text("running")
    assert foreign == []


async def test_a_runaway_jobs_page_stays_bounded_and_answers(
    api: RunningApi, store: Store, browser: Browser
) -> None:
    """A job that writes thousands of receipts while its page is open: the page keeps its last
    2 000 timeline rows (one change of the page per frame, not one layout per receipt) and
    answers throughout, so its Abort stays in reach."""
    job_id = await enqueue(api, "codex")
    worker = f"{job_id}:attempt:1/1"
    assert (
        await operations.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=600_000)
    ).ok
    page = await signed_in_page(browser, api, [])
    await page.goto(f"{api.url}/console/jobs/{job_id}")
    await expect(page.locator("#status")).to_have_text("leased")
    await page.wait_for_timeout(300)  # the event stream connects
    for n in range(2_500):
        await operations.progress(
            store, rid(job_id), worker_id=worker, attempt=1, data={"lines": [f"burst {n}"]}
        )
    await expect(page.locator("#output")).to_contain_text("burst 2499", timeout=30_000)
    answered = await asyncio.wait_for(page.evaluate("document.readyState"), timeout=5)
    assert answered == "complete"
    rows = await page.locator("#timeline tr").count()
    assert 0 < rows <= 2_000, rows
    await expect(page.get_by_role("button", name="Abort")).to_be_enabled()


async def test_retry_all_retries_a_group_whose_error_has_several_lines(
    api: RunningApi, store: Store, browser: Browser
) -> None:
    """A group's error goes back in a hidden field; a browser posts each line break of a field as
    CRLF (and reads a CR of the page as LF), so an error of several lines (a traceback, a
    command's stderr) never matched its jobs: "Retry all" retried none."""
    agent = f"agent-{new_id()}"
    ids = [await enqueue(api, agent) for _ in range(2)]
    errors = ("exit 1\nstderr: disk full", "exit 1\r\nstderr: no space")
    for job_id, error in zip(ids, errors, strict=True):
        assert (await operations.fail_undeliverable(store, rid(job_id), error=error)).ok
    page = await signed_in_page(browser, api, [])
    await page.goto(f"{api.url}/console/failed?agentId={agent}")
    for _ in ids:
        await page.get_by_role("button", name="Retry all 1").first.click()
        await expect(page.locator(".notice")).to_have_text("1 job(s) retried")
    for job_id in ids:
        job = await store.get_job(rid(job_id))
        assert job is not None and job.retried_as is not None
