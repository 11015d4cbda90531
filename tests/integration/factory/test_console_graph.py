"""An objective's task graph in the console, in a real browser, turning green as a real stack
(driver, workers, outbox loop on Temporal) runs the diamond; a real `receipt api` serves it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from temporalio.client import Client

from receipts.store import Store
from tests.e2e.test_console_browser import CHROMIUM, FLAGS, SCREENSHOTS
from tests.integration.api_support import TOKEN_A, running_api
from tests.integration.delivery.conftest import running_stack
from tests.integration.factory.conftest import outbox_running, run_objective, wait_objective
from tests.integration.factory.test_objectives import diamond

if not shutil.which(CHROMIUM):
    pytest.skip(
        f"NO CHROMIUM at {CHROMIUM}: the objective graph's browser test is SKIPPED",
        allow_module_level=True,
    )

from playwright.async_api import async_playwright, expect


async def test_an_objectives_graph_turns_green_live(
    client: Client, fresh_store: Store, fresh_db: str, tmp_path: Path
) -> None:
    objective = diamond("graph-1")
    objective["tasks"][0]["input"]["command"] = ["sh", "-c", "sleep 3; echo a >> order.txt"]
    with running_api(fresh_db, tmp_path) as api:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                foreign: list[str] = []
                page.on(
                    "request",
                    lambda r: None if r.url.startswith(api.url) else foreign.append(r.url),
                )
                await page.goto(f"{api.url}/console/login")
                await page.fill('input[name="token"]', TOKEN_A)
                await page.click('button[type="submit"]')
                async with (
                    running_stack(client, fresh_store, fresh_db) as stack,
                    outbox_running(stack),
                ):
                    await run_objective(fresh_store, objective)
                    # The factory.run job creates the objective; the page follows from there.
                    await wait_objective(fresh_store, "graph-1", done=("active", "completed"))
                    await page.goto(f"{api.url}/console/objectives")
                    await page.get_by_role("link", name="graph-1").click()
                    first = page.locator('g.node[data-key="a"]')
                    await expect(first).to_have_class("node status-running", timeout=30_000)
                    await wait_objective(fresh_store, "graph-1", audited=True)
                    for key in ("a", "b", "c", "d", "step:validate", "step:publish"):
                        node = page.locator(f'g.node[data-key="{key}"]')
                        await expect(node).to_have_class("node status-completed", timeout=15_000)
                    await expect(page.locator("#status")).to_have_text("completed")
                    await expect(page.locator("pre.audit")).to_contain_text('"completed": 4')
                if SCREENSHOTS:
                    await page.screenshot(
                        path=str(Path(SCREENSHOTS) / "console-objective.png"), full_page=False
                    )
                assert foreign == []
            finally:
                await browser.close()
