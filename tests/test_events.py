from __future__ import annotations

import threading

import anyio
import pytest

from core.telemetry.events import EventHub

pytestmark = pytest.mark.anyio


async def test_publish_fans_out_and_streams_end_after_close() -> None:
    hub = EventHub()
    first, second = hub.subscribe(), hub.subscribe()
    for i in range(3):
        hub.publish({"i": i})
    hub.close()
    assert [r["i"] async for r in first] == [0, 1, 2]
    assert [r["i"] async for r in second] == [0, 1, 2]


async def test_full_buffer_drops_oldest_and_counts() -> None:
    hub = EventHub()
    stream = hub.subscribe(capacity=3)
    for i in range(10):
        hub.publish({"i": i})
    hub.close()
    assert [r["i"] async for r in stream] == [7, 8, 9]
    assert stream.dropped == 7 and hub.published == 10


async def test_publishing_from_a_thread_never_waits_for_the_consumer() -> None:
    hub = EventHub()
    stream = hub.subscribe(capacity=10)
    done = threading.Event()

    def produce() -> None:
        for i in range(100_000):
            hub.publish({"i": i})
        done.set()

    await anyio.to_thread.run_sync(produce)  # nobody consumes meanwhile
    assert done.is_set() and stream.dropped == 100_000 - 10


async def test_unsubscribed_stream_gets_nothing_more() -> None:
    hub = EventHub()
    stream = hub.subscribe()
    hub.publish({"i": 0})
    await stream.aclose()
    hub.publish({"i": 1})
    assert [r async for r in stream] == [{"i": 0}]


@pytest.mark.parametrize("woken", [True, False], ids=["woken after a drain", "by its poll"])
async def test_consumer_waiting_for_records_wakes_up(woken: bool) -> None:
    hub = EventHub()
    # Woken: the default poll (0.5 s) never fires within the test; polled: every 20 ms.
    stream = hub.subscribe() if woken else hub.subscribe(poll_interval_s=0.02)
    got: list[int] = []

    async def consume() -> None:
        async for record in stream:
            got.append(record["i"])

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.05)
        hub.publish({"i": 1})
        if woken:
            hub.wake_all()  # what the run does after each drain of its log
        await anyio.sleep(0.05)
        assert got == [1]
        hub.close()
