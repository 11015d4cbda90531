"""The order `make test`'s pytest workers receive the suite in.

pytest-xdist's `worksteal` hands each of its N workers a contiguous 1/N of the collected tests
(by count), and an idle worker later steals the second half of another's queue. In collection
order the first quarter held every end-to-end test (tests/deploy and tests/e2e sort first), so
one worker ran most of them one after another while the others finished the unit tests: the
suite's wall time was that worker's. Here each worker's share starts with an equal part of the
estimated work (test files dealt longest first to the least loaded share, a file never split),
and the unit tests, which cost next to nothing, fill every share to the count xdist cuts it at.
"""

from __future__ import annotations

from collections.abc import Sequence

# Estimated seconds per test by where it lives (the order only needs their proportions).
SECONDS = (
    ("tests/e2e/", 25.0),
    ("tests/deploy/test_client_wheel.py", 30.0),
    ("tests/integration/delivery/", 2.0),
    ("tests/integration/factory/", 1.5),
    ("tests/integration/", 0.6),
    ("tests/deploy/", 0.5),
)
UNIT = "tests/unit/"
UNIT_SECONDS = 0.02


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def estimate(path: str) -> float:
    """The estimated seconds of one test in `path`."""
    for prefix, seconds in SECONDS:
        if path.startswith(prefix):
            return seconds
    return UNIT_SECONDS


def share_sizes(total: int, workers: int) -> list[int]:
    """How many tests xdist's first distribution sends each worker: what is left, divided among
    the workers left (xdist/scheduler/worksteal.py `check_schedule`)."""
    sizes, left = [], total
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    return sizes


def spread(nodeids: Sequence[str], workers: int) -> list[int]:
    """A permutation of `nodeids`' indices: `workers` contiguous shares of xdist's sizes, each
    starting with its files of the heavier kinds (longest first), then filled with unit tests.
    Deterministic, so every worker collects the same order."""
    files: dict[str, list[int]] = {}
    for index, nodeid in enumerate(nodeids):
        files.setdefault(file_of(nodeid), []).append(index)
    heavy = [f for f in files if not f.startswith(UNIT)]
    light = [i for f in files if f.startswith(UNIT) for i in files[f]]
    heavy.sort(key=lambda f: (-estimate(f) * len(files[f]), f))
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for path in heavy:
        target = min(range(workers), key=lambda w: (loads[w], w))
        shares[target].extend(files[path])
        loads[target] += estimate(path) * len(files[path])
    order: list[int] = []
    sizes = share_sizes(len(nodeids), workers)
    for share, size in zip(shares, sizes, strict=True):
        take = max(0, size - len(share))
        order += share + light[:take]
        light = light[take:]
    return order + light
