"""A malformed RECEIPT_DATABASE_URL stops a command at its settings, as any bad setting (one
line, exit 2), its password never printed: libpq's own parse error quotes the whole URL."""

from __future__ import annotations

from click.testing import CliRunner

from roles.cli.main import main


def test_migrate_with_a_malformed_database_url_prints_no_password() -> None:
    env = {"RECEIPT_DATABASE_URL": "postgres:s3cret@127.0.0.1/receipt"}
    result = CliRunner().invoke(main, ["migrate"], env=env)
    assert result.exit_code == 2, result.output
    assert "RECEIPT_DATABASE_URL must be" in result.output
    assert "s3cret" not in result.output
