"""The bench's round-trip counter (tools/bench/roundtrips.py) against real PostgreSQL: what it
counts is what the client waited on."""

from __future__ import annotations

import psycopg

from tools.bench.roundtrips import CountingProxy


async def test_each_statement_is_a_round_trip_and_a_pipeline_is_one(db_url: str) -> None:
    proxy = CountingProxy(db_url)
    url = await proxy.start()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            before = proxy.snapshot()
            for _ in range(3):
                await conn.execute("SELECT 1")
            three = proxy.snapshot().minus(before)
            async with conn.transaction():
                await conn.execute("SELECT 1")
            transaction = proxy.snapshot().minus(before).minus(three)
            mark = proxy.snapshot()
            async with conn.pipeline():
                for _ in range(3):
                    await conn.execute("SELECT 1")
            pipelined = proxy.snapshot().minus(mark)
    finally:
        await proxy.close()
    assert (three.round_trips, three.statements) == (3, 3)
    # BEGIN, the statement, COMMIT: three waits on the server.
    assert (transaction.round_trips, transaction.statements) == (3, 3)
    # Sent at once: one wait, three statements.
    assert pipelined.round_trips == 1
    assert pipelined.statements == 3
    assert proxy.counts.connections == 1
