"""How RECEIPT_TEMPORAL_* (and an envconfig profile) become `Client.connect` arguments."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
from temporalio.service import TLSConfig

from receipts.settings import Settings, SettingsError
from roles.infra.temporal import (
    DEFAULT_ADDRESS,
    TemporalConfigError,
    TemporalTLSSettings,
    connect_client,
    connect_config,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("RECEIPT_TEMPORAL", "TEMPORAL_")):
            monkeypatch.delenv(name)


def config(**env: str) -> dict[str, Any]:
    """`connect_config` of the settings the variables `env` give (as a role loads them)."""
    return connect_config(Settings.load(env), TemporalTLSSettings.load(env))


async def test_a_restarted_process_with_its_predecessors_pid_and_host_is_another_identity() -> None:
    """A container restarted in its pod has the same pid (often 1) and hostname: each start's
    client is another identity to Temporal, so readiness never reads the predecessor's last poll
    as this process's (roles/infra/health.py)."""
    first, second = [
        await connect_client(Settings.load({}), TemporalTLSSettings.load({}), lazy=True)
        for _ in range(2)
    ]
    assert first.identity != second.identity
    for client in (first, second):
        assert client.identity.startswith(f"{os.getpid()}@{socket.gethostname()}#")


def test_defaults_are_the_local_dev_server_without_tls() -> None:
    assert config() == {"target_host": DEFAULT_ADDRESS, "namespace": "default"}


def test_address_namespace_and_mtls_files(tmp_path: Path) -> None:
    for name in ("cert", "key", "ca"):
        (tmp_path / f"{name}.pem").write_bytes(f"PEM {name}".encode())
    connect = config(
        RECEIPT_TEMPORAL_ADDRESS="receipt.abcd.tmprl.cloud:7233",
        RECEIPT_TEMPORAL_NAMESPACE="receipt.abcd",
        RECEIPT_TEMPORAL_TLS_CERT=str(tmp_path / "cert.pem"),
        RECEIPT_TEMPORAL_TLS_KEY=str(tmp_path / "key.pem"),
        RECEIPT_TEMPORAL_TLS_CA=str(tmp_path / "ca.pem"),
        RECEIPT_TEMPORAL_TLS_SERVER_NAME="temporal.internal",
    )

    assert connect["target_host"] == "receipt.abcd.tmprl.cloud:7233"
    assert connect["namespace"] == "receipt.abcd"
    assert connect["tls"] == TLSConfig(
        client_cert=b"PEM cert",
        client_private_key=b"PEM key",
        server_root_ca_cert=b"PEM ca",
        domain="temporal.internal",
    )
    assert "api_key" not in connect


def test_an_api_key_turns_tls_on_with_system_roots() -> None:
    connect = config(RECEIPT_TEMPORAL_API_KEY="k-123")
    assert connect["api_key"] == "k-123"
    assert connect["tls"] is True


def test_tls_zero_turns_it_off_even_with_an_api_key() -> None:
    assert config(RECEIPT_TEMPORAL_API_KEY="k-123", RECEIPT_TEMPORAL_TLS="0")["tls"] is False


def test_empty_values_mean_unset() -> None:
    """The base ConfigMap lists every variable, the optional ones empty."""
    names = ("TLS", "TLS_CERT", "TLS_KEY", "TLS_CA", "TLS_SERVER_NAME", "API_KEY", "PROFILE")
    empty = {f"RECEIPT_TEMPORAL_{name}": "" for name in names}
    assert config(**empty) == {"target_host": DEFAULT_ADDRESS, "namespace": "default"}


def test_certificate_without_key_is_refused_at_start_naming_both(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"RECEIPT_TEMPORAL_TLS_CERT and .*_KEY"):
        config(RECEIPT_TEMPORAL_TLS_CERT=str(tmp_path / "cert.pem"))


def test_unreadable_certificate_names_the_variable(tmp_path: Path) -> None:
    settings = TemporalTLSSettings(
        RECEIPT_TEMPORAL_TLS_CERT=tmp_path / "missing.pem",
        RECEIPT_TEMPORAL_TLS_KEY=tmp_path / "missing-key.pem",
    )
    with pytest.raises(TemporalConfigError, match="RECEIPT_TEMPORAL_TLS_CERT: cannot read"):
        connect_config(Settings(), settings)


def test_tls_off_contradicting_certificates_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="RECEIPT_TEMPORAL_TLS=0 contradicts"):
        config(RECEIPT_TEMPORAL_TLS="0", RECEIPT_TEMPORAL_TLS_CA=str(tmp_path))


def test_an_envconfig_profile_is_the_base_and_receipt_variables_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.pem").write_bytes(b"PEM profile ca")
    config_file = tmp_path / "temporal.toml"
    config_file.write_text(
        "[profile.prod]\n"
        'address = "prod.example:7233"\n'
        'namespace = "prod-ns"\n'
        'api_key = "profile-key"\n'
        "[profile.prod.tls]\n"
        f'server_ca_cert_path = "{tmp_path / "ca.pem"}"\n'
    )
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config_file))  # the SDK reads it

    connect = config(RECEIPT_TEMPORAL_PROFILE="prod")
    assert connect["target_host"] == "prod.example:7233"
    assert connect["namespace"] == "prod-ns"
    assert connect["api_key"] == "profile-key"
    assert isinstance(connect["tls"], TLSConfig)
    assert connect["tls"].server_root_ca_cert == b"PEM profile ca"

    connect = config(
        RECEIPT_TEMPORAL_PROFILE="prod",
        RECEIPT_TEMPORAL_NAMESPACE="override-ns",
        RECEIPT_TEMPORAL_API_KEY="override-key",
    )
    assert connect["namespace"] == "override-ns"
    assert connect["api_key"] == "override-key"
    assert connect["target_host"] == "prod.example:7233"
