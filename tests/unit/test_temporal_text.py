"""What Temporal is shown of a tenant's free text (workflows/driver.py `bounded`)."""

from __future__ import annotations


def test_free_text_is_shown_to_temporal_within_its_limits() -> None:
    """What Temporal is shown of an agent id is at most SEARCHABLE_BYTES as it counts them
    (JSON-escaped); every ASCII id the API accepts is shown whole."""
    import json

    from workflows.driver import SEARCHABLE_BYTES, SUMMARY_BYTES, bounded

    for ascii_id in ("a" * 200, 'quote"and\\backslash' * 9):
        assert bounded(ascii_id, SEARCHABLE_BYTES) == ascii_id
    for text, limit in (("\U0001f600" * 200, SEARCHABLE_BYTES), ("é" * 300, SUMMARY_BYTES)):
        shown = bounded(text, limit)
        assert len(json.dumps(shown)) <= limit
        assert shown.endswith("…") and text.startswith(shown[:-1])
        assert len(json.dumps(text[: len(shown)] + "…")) > limit  # the longest prefix that fits
