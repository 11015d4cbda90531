"""How RECEIPT_TEMPORAL_* (and an envconfig profile) become `Client.connect` arguments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from receipts.settings import Settings
from roles.infra.temporal import (
    DEFAULT_ADDRESS,
    TemporalConfigError,
    TemporalTLSSettings,
    connect_config,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("RECEIPT_TEMPORAL", "TEMPORAL_")):
            monkeypatch.delenv(name)


def test_defaults_are_the_local_dev_server_without_tls() -> None:
    assert connect_config() == {"target_host": DEFAULT_ADDRESS, "namespace": "default"}


def test_address_namespace_and_mtls_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("cert", "key", "ca"):
        (tmp_path / f"{name}.pem").write_bytes(f"PEM {name}".encode())
    monkeypatch.setenv("RECEIPT_TEMPORAL_ADDRESS", "receipt.abcd.tmprl.cloud:7233")
    monkeypatch.setenv("RECEIPT_TEMPORAL_NAMESPACE", "receipt.abcd")
    monkeypatch.setenv("RECEIPT_TEMPORAL_TLS_CERT", str(tmp_path / "cert.pem"))
    monkeypatch.setenv("RECEIPT_TEMPORAL_TLS_KEY", str(tmp_path / "key.pem"))
    monkeypatch.setenv("RECEIPT_TEMPORAL_TLS_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("RECEIPT_TEMPORAL_TLS_SERVER_NAME", "temporal.internal")

    config = connect_config()

    assert config["target_host"] == "receipt.abcd.tmprl.cloud:7233"
    assert config["namespace"] == "receipt.abcd"
    assert config["tls"] == TLSConfig(
        client_cert=b"PEM cert",
        client_private_key=b"PEM key",
        server_root_ca_cert=b"PEM ca",
        domain="temporal.internal",
    )
    assert "api_key" not in config


def test_an_api_key_turns_tls_on_with_system_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECEIPT_TEMPORAL_API_KEY", "k-123")
    config = connect_config()
    assert config["api_key"] == "k-123"
    assert config["tls"] is True


def test_tls_zero_turns_it_off_even_with_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECEIPT_TEMPORAL_API_KEY", "k-123")
    monkeypatch.setenv("RECEIPT_TEMPORAL_TLS", "0")
    assert connect_config()["tls"] is False


def test_empty_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The base ConfigMap lists every variable, the optional ones empty."""
    for name in ("TLS", "TLS_CERT", "TLS_KEY", "TLS_CA", "TLS_SERVER_NAME", "API_KEY", "PROFILE"):
        monkeypatch.setenv(f"RECEIPT_TEMPORAL_{name}", "")
    assert connect_config() == {"target_host": DEFAULT_ADDRESS, "namespace": "default"}


def test_certificate_without_key_is_refused_naming_both(tmp_path: Path) -> None:
    settings = TemporalTLSSettings(RECEIPT_TEMPORAL_TLS_CERT=tmp_path / "cert.pem")
    with pytest.raises(TemporalConfigError, match=r"RECEIPT_TEMPORAL_TLS_CERT and .*_KEY"):
        connect_config(Settings(), settings)


def test_unreadable_certificate_names_the_variable(tmp_path: Path) -> None:
    settings = TemporalTLSSettings(
        RECEIPT_TEMPORAL_TLS_CERT=tmp_path / "missing.pem",
        RECEIPT_TEMPORAL_TLS_KEY=tmp_path / "missing-key.pem",
    )
    with pytest.raises(TemporalConfigError, match="RECEIPT_TEMPORAL_TLS_CERT: cannot read"):
        connect_config(Settings(), settings)


def test_tls_off_contradicting_certificates_is_refused(tmp_path: Path) -> None:
    settings = TemporalTLSSettings(RECEIPT_TEMPORAL_TLS=False, RECEIPT_TEMPORAL_TLS_CA=tmp_path)
    with pytest.raises(TemporalConfigError, match="RECEIPT_TEMPORAL_TLS=0 contradicts"):
        connect_config(Settings(), settings)


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
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config_file))
    monkeypatch.setenv("RECEIPT_TEMPORAL_PROFILE", "prod")

    config = connect_config()
    assert config["target_host"] == "prod.example:7233"
    assert config["namespace"] == "prod-ns"
    assert config["api_key"] == "profile-key"
    assert isinstance(config["tls"], TLSConfig)
    assert config["tls"].server_root_ca_cert == b"PEM profile ca"

    monkeypatch.setenv("RECEIPT_TEMPORAL_NAMESPACE", "override-ns")
    monkeypatch.setenv("RECEIPT_TEMPORAL_API_KEY", "override-key")
    config = connect_config()
    assert config["namespace"] == "override-ns"
    assert config["api_key"] == "override-key"
    assert config["target_host"] == "prod.example:7233"
