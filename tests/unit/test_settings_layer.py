"""The settings layer: one model per concern, the spec's names, one clear error per bad value,
the environment read once into one object, and the masked view `receipt config` prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import Settings, SettingsError
from receipts.timing import TimingSettings
from roles.infra.settings import (
    LoopSettings,
    ProcessSettings,
    RuntimeSettings,
    concerns,
    effective,
    load,
    shown,
)


@pytest.mark.parametrize(
    ("model", "variable", "raw", "accepts"),
    [
        (ProcessSettings, "RECEIPT_SHUTDOWN_GRACE_MS", "soon", "milliseconds"),
        (ProcessSettings, "RECEIPT_METRICS_PORT", "70000", "a port number"),
        (ProcessSettings, "RECEIPT_EVENT_LOOP", "trio", "'uvloop' or 'asyncio'"),
        (ProcessSettings, "RECEIPT_LOG_FORMAT", "xml", "'json' or 'human'"),
        (ProcessSettings, "RECEIPT_LOG_LEVEL", "loud", "'debug', 'info', 'warning' or 'error'"),
        (ProcessSettings, "RECEIPT_RESONATE_EXECUTE_CONCURRENCY", "0", "a positive integer"),
        (LoopSettings, "RESONATE_STARTUP_SETTLE_MS", "-5", "milliseconds"),
        (LoopSettings, "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS", "1.5", "milliseconds"),
        (TimingSettings, "CODEX_JOB_LEASE_MS", "1_000", "a positive integer (milliseconds)"),
        (WatchdogSettings, "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT", "many", "an integer"),
    ],
)
def test_a_bad_value_names_the_variable_what_it_accepts_and_what_it_got(
    model: type[LoopSettings], variable: str, raw: str, accepts: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        model.load({variable: raw})
    message = str(raised.value)
    assert message.startswith(f"{variable} must be ")
    assert accepts in message
    assert message.endswith(f"got {raw!r}")


def test_the_spec_names_and_defaults_and_blank_means_unset() -> None:
    process = ProcessSettings.load({"RECEIPT_EVENT_LOOP": " AsyncIO ", "RECEIPT_METRICS_PORT": " "})
    assert process.event_loop == "asyncio"
    assert process.metrics_port is None
    assert process.shutdown_grace_ms == 30_000
    loops = LoopSettings.load({"RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS": "+20"})
    assert (loops.outbox_timeout_ms, loops.outbox_interval_ms, loops.startup_settle_ms) == (
        20,
        5_000,
        1_000,
    )


def test_the_load_reports_every_bad_variable_at_once() -> None:
    env = {"RECEIPT_SHUTDOWN_GRACE_MS": "soon", "JOB_LEASE_MS": "0", "RECEIPT_DB_POOL_MAX": "none"}
    with pytest.raises(SettingsError) as raised:
        load(env)
    message = str(raised.value)
    for variable, raw in (
        ("RECEIPT_SHUTDOWN_GRACE_MS", "soon"),
        ("JOB_LEASE_MS", "0"),
        ("RECEIPT_DB_POOL_MAX", "none"),
    ):
        assert f"{variable} must be" in message
        assert repr(raw) in message


def test_secrets_and_a_database_password_are_masked() -> None:
    assert shown("RECEIPT_API_TOKENS", "t0ken org-a") == "***"
    assert shown("RECEIPT_CALLBACK_SIGNING_SECRET", "s3cret") == "***"
    assert shown("RECEIPT_CALLBACK_TOKEN", "abc") == "***"
    url = shown("RECEIPT_DATABASE_URL", "postgresql://app:hunter2@db.internal:5432/receipt")
    assert "hunter2" not in url
    assert "db.internal" in url and "***" in url
    assert shown("RECEIPT_DATABASE_URL", "postgresql://app@db/receipt").endswith("receipt")
    assert shown("RECEIPT_TEMPORAL_ADDRESS", None) == "(unset)"
    assert shown("RECEIPT_TEMPORAL_ADDRESS", "temporal:7233") == "temporal:7233"


def test_the_temporal_api_key_and_a_urls_password_are_masked_too() -> None:
    assert shown("RECEIPT_TEMPORAL_API_KEY", "tmprl-k3y") == "***"
    callback = shown("RECEIPT_EVENT_CALLBACK_URL", "https://hook:cbPassw0rd@cb.example/x?a=1")
    assert callback == "https://hook:***@cb.example/x?a=1"
    assert shown("RECEIPT_TEMPORAL_UI_URL", "http://localhost:8233") == "http://localhost:8233"
    assert shown("RECEIPT_TEMPORAL_TLS_KEY", "/etc/tls/client.key") == "/etc/tls/client.key"
    assert shown("RECEIPT_MAX_JSON_KEY_CHARS", 256) == "256"


def test_a_url_setting_that_does_not_parse_is_shown_not_a_traceback() -> None:
    """`receipt config` reads each *_URL to mask its password: one that does not parse (an IPv6
    typo's unclosed [) ended the command in a ValueError traceback, every setting unshown."""
    typo = "http://[fd00::1:8233"
    assert shown("RECEIPT_TEMPORAL_UI_URL", typo) == typo
    masked = shown("RECEIPT_EVENT_CALLBACK_URL", "https://hook:cbPassw0rd@[fd00::1/x")
    assert "cbPassw0rd" not in masked and "***" in masked


@pytest.mark.parametrize(
    "url",
    [
        "postgres:s3cret@127.0.0.1/receipt",  # no scheme: libpq reads it as key=value pairs
        "postgresql://app:s3cret@[::1/receipt",
        "postgresql://app:s3cret@db/receipt?sslmod=require",
    ],
)
def test_a_malformed_database_url_is_refused_at_load_without_its_password(url: str) -> None:
    # libpq's parse error quotes the whole string: a role crashed with it in its traceback and
    # `receipt migrate` printed it, the password with it.
    with pytest.raises(SettingsError) as raised:
        load({"RECEIPT_DATABASE_URL": url})
    message = str(raised.value)
    assert message.startswith("RECEIPT_DATABASE_URL must be a PostgreSQL connection URL")
    assert "s3cret" not in message
    assert message.endswith("got '***'")


def test_the_direct_database_url_is_a_database_url_too() -> None:
    """RECEIPT_DATABASE_DIRECT_URL (beside a transaction pooler): refused like the other when it
    does not parse, its password never printed, and meaningless without RECEIPT_DATABASE_URL."""
    pooler = "postgresql://app:s3cret@pgbouncer:6432/receipt"
    with pytest.raises(SettingsError) as raised:
        load({"RECEIPT_DATABASE_URL": pooler, "RECEIPT_DATABASE_DIRECT_URL": "postgres:s3cret@db"})
    assert str(raised.value) == (
        "RECEIPT_DATABASE_DIRECT_URL must be a PostgreSQL connection URL "
        "(postgresql://user:password@host:port/db) or key=value string, got '***'"
    )
    shown_value = shown("RECEIPT_DATABASE_DIRECT_URL", "host=db user=app password=s3cret")
    assert "s3cret" not in shown_value and "host=db" in shown_value
    with pytest.raises(SettingsError, match="RECEIPT_DATABASE_DIRECT_URL is set without"):
        load({"RECEIPT_DATABASE_DIRECT_URL": "postgresql://app@db/receipt"})
    direct = "postgresql://app:s3cret@db:5432/receipt"
    settings = load({"RECEIPT_DATABASE_URL": pooler, "RECEIPT_DATABASE_DIRECT_URL": direct})
    assert settings.core.database_direct_url == direct


def test_the_load_also_reports_the_sandboxs_and_temporals_settings() -> None:
    with pytest.raises(SettingsError, match="RECEIPT_SANDBOX_UIDS must be 'first-last'"):
        load({"RECEIPT_SANDBOX_UIDS": "many"})
    with pytest.raises(SettingsError, match="RECEIPT_TEMPORAL_TLS_KEY must be set together"):
        load({"RECEIPT_TEMPORAL_TLS_CERT": "/etc/tls/client.pem"})
    with pytest.raises(SettingsError, match="RECEIPT_TEMPORAL_TLS=0 contradicts"):
        load({"RECEIPT_TEMPORAL_TLS": "0", "RECEIPT_TEMPORAL_TLS_CA": "/etc/tls/ca.pem"})


def test_a_field_is_read_only_through_its_variable_never_its_python_name() -> None:
    # HOST, PORT, ROLE, PATH, TOKENS …: what a machine's environment may well hold.
    env = {
        name.upper(): "set-by-its-python-name"
        for _, model in concerns()
        for name, field in model.model_fields.items()
        if field.alias and field.alias.upper() != name.upper()
    }
    assert env
    assert load(env) == load({})


def test_every_concern_is_one_part_of_the_one_object_and_printed_by_config() -> None:
    settings = load({"RECEIPT_TEMPORAL_TLS": "1", "RECEIPT_API_PORT": "8123", "TZ": "UTC"})
    assert isinstance(settings, RuntimeSettings)
    assert settings.temporal_tls.tls is True and settings.api.port == 8123
    assert settings.handlers.sandbox is settings.sandbox
    printed = {
        variable: (value, is_set)
        for _, rows in effective(settings)
        for variable, value, is_set in rows
    }
    assert printed["RECEIPT_TEMPORAL_TLS"] == ("True", True)
    assert printed["RECEIPT_TEMPORAL_TLS_CERT"] == ("(unset)", False)
    assert printed["RECEIPT_API_PORT"] == ("8123", True)
    assert printed["RECEIPT_TEMPORAL_API_KEY"] == ("(unset)", False)
    # Every field of every concern is printed, once: two concerns read each of these.
    assert len(printed) == sum(len(model.model_fields) for _, model in concerns()) - len(
        {"RECEIPT_DATA_DIR", "RECEIPT_ORG_EXECUTABLES"}
    )


@pytest.mark.parametrize(
    ("raw", "caps"),
    [
        (None, {"receipt-chat": 12, "receipt-codex": 3, "receipt-control": 6}),
        ("5", {"receipt-chat": 5, "receipt-codex": 5, "receipt-control": 5}),
        ("0", {"receipt-chat": 0, "receipt-codex": 0, "receipt-control": 0}),
        # A group not named keeps its default; 0 turns one group's cap off.
        (" codex=1 , chat=0", {"receipt-chat": 0, "receipt-codex": 1, "receipt-control": 6}),
    ],
)
def test_the_per_group_cap_of_an_organizations_running_jobs(
    raw: str | None, caps: dict[str, int]
) -> None:
    env = {} if raw is None else {"RECEIPT_ORG_MAX_RUNNING_PER_GROUP": raw}
    settings = Settings(**env)
    assert {queue: settings.org_running_cap(queue) for queue in caps} == caps


@pytest.mark.parametrize("raw", ["-1", "1.5", "codex", "codex=", "gpu=2", "codex=-2", "codex=2,"])
def test_a_bad_per_group_cap_names_what_it_accepts(raw: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(RECEIPT_ORG_MAX_RUNNING_PER_GROUP=raw)
    assert "group=number pairs, the groups being chat, codex, control" in str(raised.value)


def test_a_variable_is_read_by_its_exact_name_and_a_model_is_frozen() -> None:
    assert TimingSettings.load({"codex_job_lease_ms": "800000"}) == TimingSettings()
    assert TimingSettings.load({"CODEX_JOB_LEASE_MS": "800000"}).codex_job_lease_ms == 800_000
    with pytest.raises(ValidationError):
        TimingSettings().job_lease_ms = 1  # type: ignore[misc]
    # Built in code, a model is its defaults: nothing is read from the process environment.
    assert TimingSettings() == TimingSettings.load({})


def test_a_file_a_setting_names_is_read_at_start_and_a_bad_one_named(tmp_path: Path) -> None:
    """Every process checks every concern at start: an executables file that cannot be read or
    parsed stops it with the variable's line, never a traceback."""
    allowed = tmp_path / "executables.json"
    allowed.write_text('{"org-a": ["git", "pytest"]}')
    loaded = load({"RECEIPT_ORG_EXECUTABLES": str(allowed)})
    assert loaded.api.org_executables == {"org-a": ["git", "pytest"]}
    # The Factory's worker holds a planner's tasks to the same lists.
    assert loaded.factory.org_executables == loaded.api.org_executables
    missing = str(tmp_path / "missing.json")
    with pytest.raises(SettingsError, match="RECEIPT_ORG_EXECUTABLES must be a readable JSON file"):
        load({"RECEIPT_ORG_EXECUTABLES": missing})
    with pytest.raises(SettingsError, match="RECEIPT_ORG_EXECUTABLES must be a JSON object"):
        load({"RECEIPT_ORG_EXECUTABLES": "{bad"})
