"""A delivery's worker id: which attempt of which job, scheduled by which driver run, in which
of Temporal's deliveries of it (`<jobId>:attempt:<n>.<run>/<k>`), and which of two deliveries
may take the other's lease."""

from __future__ import annotations

import re


def delivery_id(job_id: str, attempt: int, run_id: str, delivery: int) -> str:
    """The worker id of delivery `delivery` (Temporal's attempt of the activity) of attempt
    `attempt`, scheduled by the driver run `run_id`: `<jobId>:attempt:<n>.<run>/<k>`. A refunded
    attempt (a worker's shutdown release) is scheduled again under the same number by a new
    driver run, whose deliveries count from 1 again: without the run in it, a delivery taken
    over in the old run held the fence of the new run's first one, and settled its job."""
    return f"{job_id}:attempt:{attempt}.{run_id[:12]}/{delivery}"


def delivery_number(worker_id: str) -> int | None:
    """The Temporal delivery `k` in a worker id `<jobId>:attempt:<n>.<run>/<k>` (or the older
    `<jobId>:attempt:<n>/<k>`), if it has that shape."""
    _, slash, tail = worker_id.rpartition("/")
    return int(tail) if slash and tail.isdigit() else None


_OF_A_RUN = re.compile(r":attempt:\d+\.[^:/]*$")  # `<jobId>:attempt:<n>.<run>`


def newer_delivery(candidate: str, holder: str) -> bool:
    """True when `candidate` is a later delivery than `holder` of the same driver run (or either
    id has no number). Deliveries of two runs are not ordered by their numbers (each run counts
    from 1): a stalled delivery of an ended run, whose attempt was refunded and scheduled again
    by the next run, must not take the lease from that run's live delivery."""
    new, old = delivery_number(candidate), delivery_number(holder)
    if new is None or old is None:
        return True
    run, held_run = candidate.rpartition("/")[0], holder.rpartition("/")[0]
    if run != held_run and _OF_A_RUN.search(run) and _OF_A_RUN.search(held_run):
        return False
    return new > old
