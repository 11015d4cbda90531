"""The task monitor's hand-off: whom it hands the watch on to."""

from __future__ import annotations

from activities.handlers.monitor import successor_id
from receipts.tenancy import scoped_id


def test_a_monitors_successor_is_derived_from_its_own_id_in_its_organization() -> None:
    first = scoped_id("org-a", "objective:rel:task:t:try:1:monitor")
    second = successor_id(first)
    assert second == scoped_id("org-a", "objective:rel:task:t:try:1:monitor:part:2")
    assert successor_id(second) == scoped_id("org-a", "objective:rel:task:t:try:1:monitor:part:3")
    assert successor_id("m1") == "m1:part:2"  # an id without an organization stays without
