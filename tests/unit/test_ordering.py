"""tests/ordering.py: each xdist worker's share of the suite starts with an equal part of the
heavy test files, whole, and every test is run once."""

from __future__ import annotations

import itertools

from tests.ordering import estimate, share_sizes, spread


def suite() -> list[str]:
    ids = [f"tests/deploy/test_d.py::t{i}" for i in range(4)]
    ids += [f"tests/e2e/test_{name}.py::t{i}" for name in "abcdef" for i in range(2)]
    ids += [f"tests/integration/test_i{k}.py::t{i}" for k in range(8) for i in range(5)]
    ids += [f"tests/unit/test_u{k}.py::t{i}" for k in range(10) for i in range(30)]
    return ids


def test_every_test_once_and_each_share_starts_with_an_equal_part_of_the_heavy_files() -> None:
    ids = suite()
    order = spread(ids, 4)
    assert sorted(order) == list(range(len(ids)))
    ordered = [ids[i] for i in order]
    bounds = [0]
    for size in share_sizes(len(ids), 4):
        bounds.append(bounds[-1] + size)
    shares = [ordered[a:b] for a, b in itertools.pairwise(bounds)]
    e2e = [sum(1 for t in share if t.startswith("tests/e2e/")) for share in shares]
    assert e2e == [4, 4, 2, 2]  # six files of 50 s each: 2, 2, 1, 1 files
    loads = [sum(estimate(t.split("::")[0]) for t in share) for share in shares]
    assert max(loads) - min(loads) <= 50  # at most one e2e file apart
    for share in shares:  # the heavy files first, the unit tests after them
        kinds = [t.startswith("tests/unit/") for t in share]
        assert kinds == sorted(kinds)
    # A file is never split across shares, and keeps its own order.
    for name in "abcdef":
        tests = [t for t in ordered if t.startswith(f"tests/e2e/test_{name}.py")]
        assert tests == [f"tests/e2e/test_{name}.py::t0", f"tests/e2e/test_{name}.py::t1"]
        spans = {i for i, share in enumerate(shares) for t in share if t in tests}
        assert len(spans) == 1


def test_the_shares_are_xdist_s_first_distribution() -> None:
    assert share_sizes(10, 4) == [2, 2, 3, 3]
    assert sum(share_sizes(2433, 4)) == 2433
