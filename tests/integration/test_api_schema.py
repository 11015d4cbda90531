"""Schemathesis against the OpenAPI schema of a real `receipt api` process.

Generated requests (valid and invalid, every operation, schemathesis' coverage and fuzzing
phases) must never answer 500, and every answer must match the schema: a documented status
code, content type, headers and body. Invalid requests must be refused.

Not checked: `positive_data_acceptance`. The schema cannot say everything the API refuses on
purpose with a 4xx: NUL and lone surrogates in any string (422), an opaque list cursor it did
not issue (422).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import (
    NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES,
    NegativeDataRejectionConfig,
)
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from roles.api.app import create_app
from roles.api.settings import ApiSettings
from roles.infra.settings import RuntimeSettings
from tests.integration.api_support import AS_ADMIN, RunningApi, running_api

# The schema the app publishes, built without a server (schemathesis' fixture-based loader does
# not run on pytest 9); `test_the_server_publishes_this_schema` ties it to the real one.
SCHEMA: dict[str, Any] = create_app(RuntimeSettings(api=ApiSettings(tokens="t *"))).openapi()
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    missing_required_header,
    unsupported_method,
    allow_header_conformance,
    ignored_auth,
]

schema = schemathesis.openapi.from_dict(SCHEMA)
# Requests carry the admin token (below); generated or removed Authorization headers would
# only test the token check, which test_api_auth.py covers.
schema.config.generation.update(max_examples=30, database="none", with_security_parameters=False)
# A generated body past the API's byte cap is refused 413 before it is read as JSON: a refusal
# too (the schema cannot state a byte size).
schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
    expected_statuses=[*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]
)


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("api"))) as api:
        yield api


def test_the_server_publishes_this_schema(api: RunningApi) -> None:
    assert httpx.get(f"{api.url}/openapi.json").json() == SCHEMA


@schema.parametrize()
def test_the_api_conforms_to_its_schema_and_never_answers_500(case: Any, api: RunningApi) -> None:
    # A generated job id never names a live job, so an event stream answers 404 at once; the
    # timeout only guards the run against a stream that would wait for receipts.
    case.call_and_validate(base_url=api.url, headers=AS_ADMIN, checks=CHECKS, timeout=10)


def test_every_body_and_answer_names_its_schema_and_every_stream_its_events() -> None:
    """What a generator needs (clients/python): no inline body or answer, and the events of
    each `text/event-stream` answer named (`x-events`)."""
    unnamed, streams = [], []
    for path, operations in SCHEMA["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {})
            unnamed += [(method, path, "body") for c in body.values() if "$ref" not in c["schema"]]
            for status, answer in operation["responses"].items():
                for media, content in answer.get("content", {}).items():
                    if media == "text/event-stream":
                        streams.append((path, sorted(content["x-events"])))
                    elif "$ref" not in content["schema"]:
                        unnamed.append((method, path, status))
    assert unnamed == []
    assert sorted(streams) == [
        ("/agent-jobs/{agentJobId}/events", ["end", "message"]),
        ("/jobs/{jobId}/events", ["end", "message"]),
        ("/objectives/{objectiveId}/events", ["end", "message"]),
        ("/sessions/{sessionId}/events", ["message"]),
    ]
