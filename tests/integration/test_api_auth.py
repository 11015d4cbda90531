"""Tokens and tenant isolation: two organizations can neither see nor touch each other's jobs."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receipts.store import Store
from roles.api.auth import (
    TokenConfigError,
    TokenTable,
    check_open_bind,
    load_tokens,
    parse_lines,
)
from tests.integration.api_support import (
    AS_A,
    AS_ADMIN,
    AS_B,
    TOKEN_A,
    TOKEN_ADMIN,
    TOKEN_B,
    api_client,
    enqueue_body,
    rid,
)
from tests.integration.helpers import new_id, types

# --- token configuration ----------------------------------------------------------------------


def test_the_line_format_binds_tokens_to_organizations_or_admin(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\n\nalpha-token org-a\nbeta-token   org-b  \nroot-token *\n")
    table = load_tokens(path, None)
    assert len(table) == 3
    a, b, root = (table.authenticate(t) for t in ("alpha-token", "beta-token", "root-token"))
    assert a is not None and (a.organization_id, a.admin) == ("org-a", False)
    assert b is not None and b.organization_id == "org-b"
    assert root is not None and root.admin and root.organization_id is None
    assert table.authenticate("alpha-toke") is None
    assert table.authenticate("") is None


def test_the_json_format_and_the_environment_variable_combine(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": "json-a", "organizationId": "org-a", "name": "ci"},
                    {"token": "json-root", "admin": True},
                ]
            }
        )
    )
    table = load_tokens(path, "env-b org-b, env-c org-c")
    assert len(table) == 4
    assert table.authenticate("json-root").admin  # type: ignore[union-attr]
    assert table.authenticate("env-c").organization_id == "org-c"  # type: ignore[union-attr]
    listed = tmp_path / "list.json"
    listed.write_text('[{"token": "t1", "organizationId": "o1"}]')
    assert load_tokens(listed, None).authenticate("t1") is not None


@pytest.mark.parametrize(
    "content",
    [
        "only-a-token\n",
        "a b c\n",
        '[{"token": "t"}]',
        '[{"token": "t", "organizationId": "o", "admin": true}]',
        '[{"token": "t", "organizationId": ""}]',
        '[{"token": "t", "organizationId": "o", "role": "x"}]',
        '{"tokens": "nope"}',
        "[not json",
        "same org-a\nsame org-b\n",
    ],
)
def test_an_invalid_token_file_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(content)
    with pytest.raises(TokenConfigError):
        load_tokens(path, None)


def test_errors_and_reprs_never_show_a_token(tmp_path: Path) -> None:
    secret = "s3cret-value-that-must-not-leak"
    path = tmp_path / "tokens"
    path.write_text(f"{secret} org-a\n{secret} org-b\n")
    with pytest.raises(TokenConfigError) as raised:
        load_tokens(path, None)
    assert secret not in str(raised.value)
    table = TokenTable(parse_lines(f"{secret} org-a", "test"))
    assert secret not in repr(table) and secret not in repr(vars(table))
    with pytest.raises(TokenConfigError):
        load_tokens(tmp_path / "missing", None)


def test_a_missing_token_table_may_only_serve_loopback() -> None:
    assert check_open_bind(TokenTable(), "127.0.0.1") is True
    assert check_open_bind(TokenTable(parse_lines("t org", "x")), "0.0.0.0") is False
    with pytest.raises(TokenConfigError):
        check_open_bind(TokenTable(), "0.0.0.0")


# --- tenant isolation -------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url) as client:
        yield client


async def job_of(client: httpx.AsyncClient, org: str, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.post(
        "/agents/codex/jobs", json=enqueue_body(org=org, jobId=new_id()), headers=headers
    )
    assert response.status_code == 202, response.text
    job: dict[str, Any] = response.json()["job"]
    return job


async def test_another_organizations_job_cannot_be_read_streamed_or_commanded(
    client: httpx.AsyncClient, store: Store
) -> None:
    theirs = await job_of(client, "org-b", AS_B)
    job_id = theirs["jobId"]
    absent = f"never-{new_id()}"
    for target in (job_id, absent):
        responses = [
            await client.get(f"/jobs/{target}", headers=AS_A),
            await client.get(f"/jobs/{target}/events", headers=AS_A),
            await client.get(
                f"/jobs/{target}/events", headers={**AS_A, "Accept": "text/event-stream"}
            ),
            await client.post(f"/jobs/{target}/commands", json={"type": "abort"}, headers=AS_A),
            await client.post(
                f"/jobs/{target}/commands", json={"type": "steer", "payload": 1}, headers=AS_A
            ),
        ]
        # Indistinguishable from a job that does not exist: same status, same body.
        assert [r.status_code for r in responses] == [404] * 5
        bodies = {json.dumps(r.json()).replace(target, "<id>") for r in responses}
        assert len(bodies) == 1
    assert await types(store, rid(job_id, "org-b")) == ["job.enqueued"]
    assert (await client.get(f"/jobs/{job_id}", headers=AS_B)).status_code == 200
    # An admin names jobs by the runtime's id (job ids are scoped by organization).
    assert (await client.get(f"/jobs/{rid(job_id, 'org-b')}", headers=AS_ADMIN)).status_code == 200


async def test_lists_show_only_the_callers_organization(client: httpx.AsyncClient) -> None:
    agent = new_id("agent")
    ours = (
        await client.post(f"/agents/{agent}/jobs", json=enqueue_body(org="org-a"), headers=AS_A)
    ).json()["job"]["jobId"]
    theirs = (
        await client.post(f"/agents/{agent}/jobs", json=enqueue_body(org="org-b"), headers=AS_B)
    ).json()["job"]["jobId"]

    async def listed(headers: dict[str, str], **params: str) -> list[str]:
        response = await client.get("/jobs", params={"agentId": agent, **params}, headers=headers)
        assert response.status_code == 200
        return [job["jobId"] for job in response.json()["jobs"]]

    assert await listed(AS_A) == [ours]
    assert await listed(AS_B) == [theirs]
    assert await listed(AS_A, organizationId="org-b") == []
    assert await listed(AS_ADMIN) == [rid(theirs, "org-b"), rid(ours, "org-a")]
    assert await listed(AS_ADMIN, organizationId="org-a") == [rid(ours, "org-a")]


async def test_enqueue_into_another_organization_is_refused(
    client: httpx.AsyncClient, store: Store
) -> None:
    job_id = new_id()
    response = await client.post(
        "/agents/codex/jobs", json=enqueue_body(org="org-b", jobId=job_id), headers=AS_A
    )
    assert response.status_code == 403
    assert await store.get_job(rid(job_id)) is None
    # Nor can org-a reach org-b's job through its jobId: ids are scoped by organization, so the
    # same id is org-a's own new job, and org-b's job is untouched.
    theirs = await job_of(client, "org-b", AS_B)
    again = await client.post(
        "/agents/codex/jobs", json=enqueue_body(org="org-a", jobId=theirs["jobId"]), headers=AS_A
    )
    assert again.status_code == 202 and again.json()["outcome"] == "created"
    assert "org-b" not in again.text
    assert await types(store, rid(theirs["jobId"], "org-b")) == ["job.enqueued"]


async def test_steer_by_session_key_stays_within_the_organization(
    client: httpx.AsyncClient, store: Store
) -> None:
    session = new_id("shared-session")
    theirs = (
        await client.post(
            "/agents/codex/jobs", json=enqueue_body(org="org-b", sessionKey=session), headers=AS_B
        )
    ).json()["job"]
    ours = await client.post(
        "/agents/codex/jobs",
        json=enqueue_body(org="org-a", sessionKey=session, singletonMode="steer"),
        headers=AS_A,
    )
    assert ours.json()["outcome"] == "created"
    assert ours.json()["job"]["jobId"] != theirs["jobId"]
    assert await types(store, rid(theirs["jobId"], "org-b")) == ["job.enqueued"]


async def test_a_receipt_says_nothing_of_how_much_other_organizations_write(
    client: httpx.AsyncClient,
) -> None:
    # A receipt's `position` counts every organization's receipts: shown to an organization,
    # the gap between two of its own receipts was the number another wrote in between.
    async def position(job_id: str, headers: dict[str, str]) -> int:
        page = await client.get(f"/jobs/{job_id}/events", headers=headers)
        assert page.status_code == 200, page.text
        found: int = page.json()["receipts"][0]["position"]
        return found

    first = await position((await job_of(client, "org-b", AS_B))["jobId"], AS_B)
    quiet = await position((await job_of(client, "org-b", AS_B))["jobId"], AS_B)
    for _ in range(3):  # org-a writes three receipts
        await job_of(client, "org-a", AS_A)
    busy = await position((await job_of(client, "org-b", AS_B))["jobId"], AS_B)
    assert busy - quiet == quiet - first
    # The operator still sees the global order.
    ours = rid((await job_of(client, "org-a", AS_A))["jobId"])
    assert await position(ours, AS_ADMIN) > busy


async def test_tokens_never_reach_the_logs(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        for token in (TOKEN_A, TOKEN_B, TOKEN_ADMIN, "wrong-token-value"):
            headers = {"Authorization": f"Bearer {token}"}
            await client.get("/jobs", headers=headers)
            await client.post("/agents/codex/jobs", json=enqueue_body(), headers=headers)
            await client.get("/jobs/none", headers=headers)
    text = caplog.text + " ".join(repr(vars(r)) for r in caplog.records)
    for token in (TOKEN_A, TOKEN_B, TOKEN_ADMIN, "wrong-token-value"):
        assert token not in text
