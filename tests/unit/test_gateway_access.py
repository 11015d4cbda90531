"""What a sandboxed command is told of the AI gateway (`activities/sandbox_gateway.py`)."""

from __future__ import annotations

from pathlib import Path

from activities.sandbox_gateway import SOCKET_DIR, Access


def test_a_command_is_told_the_gateway_in_every_form_agent_clis_read_and_no_key() -> None:
    access = Access(Path("/tmp/receipt-gateway-x/gateway.sock"), 4321)
    base = "http://127.0.0.1:4321"
    assert access.env("turn-token") == {
        "MODEL_GATEWAY_URL": base,
        "MODEL_GATEWAY_TOKEN": "turn-token",
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_KEY": "turn-token",
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": "turn-token",
    }
    assert access.socket_inside(True) == f"{SOCKET_DIR}/gateway.sock"
    assert access.bind_args() == ["--ro-bind", "/tmp/receipt-gateway-x", SOCKET_DIR]
