"""`receipt prune` and `receipt export`'s cutoff, checked before the database is opened: `0`
(which keeps everything as RECEIPT_RETENTION) and a malformed age are usage errors (exit 2),
never a prune of everything or a traceback."""

from __future__ import annotations

import click
import pytest

from roles.cli.main import _cutoff


@pytest.mark.parametrize(("older_than", "says"), [("0", "keeps everything"), ("30x", "duration")])
def test_an_age_of_0_or_not_a_duration_is_a_usage_error(older_than: str, says: str) -> None:
    with pytest.raises(click.BadParameter, match=says) as refused:
        _cutoff(older_than, None)
    assert refused.value.exit_code == 2


def test_an_age_is_the_cutoff() -> None:
    assert _cutoff("1w2d", None) is not None
