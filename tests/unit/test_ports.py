"""`free_port`: a port no outgoing connection can take before the server that asked binds it."""

from __future__ import annotations

import contextlib
import socket

import pytest

from roles.infra import ports


def test_a_picked_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low, _ = ports.ephemeral_range()
    for _ in range(20):
        port = ports.free_port()
        assert 20000 <= port < low, f"{port} is where outgoing connections take their source ports"
        with contextlib.closing(socket.socket()) as sock:
            sock.bind((ports.LOOPBACK, port))


def test_a_port_something_holds_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with contextlib.closing(socket.socket()) as held:
        held.bind((ports.LOOPBACK, 0))
        held.listen()
        taken = held.getsockname()[1]
        picks = iter([taken, 25001])
        monkeypatch.setattr(ports.random, "randrange", lambda *_: next(picks))
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 1, 60999))
        assert ports.free_port() == 25001


def test_no_range_below_the_ephemeral_one_falls_back_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = ports.free_port()
    assert port >= 1024
    with contextlib.closing(socket.socket()) as sock:
        sock.bind((ports.LOOPBACK, port))
