"""The chaos fault schedule is seeded, spread over the run and covers every kind."""

from __future__ import annotations

from collections import Counter

from tools.chaos.plan import FAULT_KINDS, ChaosConfig, plan_faults


def test_every_kind_is_planned_per_kind_times_within_the_window() -> None:
    config = ChaosConfig(duration_s=600, per_kind=2, seed=7)
    faults = plan_faults(config)
    assert Counter(f.kind for f in faults) == dict.fromkeys(FAULT_KINDS, 2)
    assert all(60 <= f.planned_s <= 480 for f in faults)
    assert [f.planned_s for f in faults] == sorted(f.planned_s for f in faults)


def test_the_schedule_is_reproducible_from_its_seed() -> None:
    first = [(f.kind, f.planned_s) for f in plan_faults(ChaosConfig(seed=3))]
    again = [(f.kind, f.planned_s) for f in plan_faults(ChaosConfig(seed=3))]
    other = [(f.kind, f.planned_s) for f in plan_faults(ChaosConfig(seed=4))]
    assert first == again and first != other


def test_default_count_is_one_per_five_minutes_of_load() -> None:
    assert len(plan_faults(ChaosConfig(duration_s=900))) == 3 * len(FAULT_KINDS)
    assert len(plan_faults(ChaosConfig(duration_s=60))) == len(FAULT_KINDS)
