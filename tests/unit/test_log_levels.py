"""What a failure path logs, and at which level (the log-events audit of 2026-12-07): a
condition an operator must act on is a WARNING line, and a handled one that the loop tries again
is no ERROR."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from activities.gateway import Gateway
from activities.gateway_providers import load_providers


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def test_a_credential_left_out_for_its_missing_key_is_logged_at_the_gateways_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Left out in silence: `gateway.ready` named the bindings only, and a binding whose every
    # key was missing answered each call 503 "no usable credential" with no line saying why.
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"""
providers:
  - id: openai-main
    api: openai
    baseUrl: https://api.openai.com/v1
    credentials:
      - {{id: a, env: OPENAI_KEY_A}}
      - {{id: b, env: OPENAI_KEY_UNSET}}
      - {{id: c, file: {tmp_path / "absent.key"}}}
      - {{id: d, env: OPENAI_KEY_A, disabled: true}}
  - id: spare
    api: openai
    baseUrl: https://example.invalid/v1
    credentials:
      - {{id: e, env: SPARE_KEY_UNSET}}
"""
    )
    providers = load_providers(path, {"OPENAI_KEY_A": "sk-a"})
    caplog.set_level(logging.INFO, logger="activities.gateway")
    async with httpx.AsyncClient() as http:
        Gateway(providers, http)
    unusable = _events(caplog, "gateway.credentials_unusable")
    assert [
        (r.levelno, vars(r)["binding"], vars(r)["credentials"], vars(r)["dead"]) for r in unusable
    ] == [
        (logging.WARNING, "openai-main", ["b", "c"], None),
        (logging.WARNING, "spare", ["e"], "provider 'spare' has no usable credential"),
    ]
