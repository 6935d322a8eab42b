"""The blocking API from plain threads, against the emulator served by another process."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from typing import Any

import anyio.from_thread
import anyio.to_thread
import pytest

from nsq_anyio.blocking import Consumer, Message, Producer
from nsq_emulator.proxy import FaultProxy
from nsq_proto import LocalProtocolError
from tests.support.served import as_in_a_terminal, server
from tests.support.servers import channel_stats

__all__ = ["server"]


def test_a_script_publishes_and_consumes(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    threads_before = threading.active_count()
    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish("orders", b"one")
        producer.publish_many("orders", [b"two", b"three"])
    got = []
    with Consumer("orders", "c", nsqd_tcp_addresses=[nsqd], max_in_flight=10) as consumer:
        for message in consumer:
            got.append(message.body)
            message.finish()
            if len(got) == 3:
                break
    assert sorted(got) == [b"one", b"three", b"two"]
    assert threading.active_count() == threads_before  # no thread left behind
    stats = channel_stats(server["nsqd HTTP"], "orders", "c")
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0)


def test_many_threads_publish_through_one_producer(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:

        def publish(k: int) -> None:
            for i in range(50):
                producer.publish("many", b"%d-%d" % (k, i))

        workers = [threading.Thread(target=publish, args=(k,)) for k in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert max(c["outstanding"] for c in producer.stats()["connections"]) <= 8
    with urllib.request.urlopen(f"http://{server['nsqd HTTP']}/stats?format=json&topic=many") as r:
        (topic,) = json.load(r)["topics"]
    assert topic["message_count"] == 400


def test_threads_publishing_while_nsqd_reads_nothing_all_get_their_answer_once_it_reads(
    server: dict[str, str],
) -> None:
    """nsqd reads nothing for a second while 8 threads publish bodies of 1 MB: the
    socket's buffers fill, so a publish handed to the loop by a callback must start a
    write that waits for room.  Once nsqd reads again every publish is answered, none waits
    for ``publish_timeout``, and nsqd has every message."""
    errors: list[BaseException] = []
    with anyio.from_thread.start_blocking_portal() as portal:
        proxy = FaultProxy(server["nsqd TCP"])
        with portal.wrap_async_context_manager(proxy):
            with Producer(nsqd_tcp_addresses=[proxy.address], publish_timeout=10.0) as producer:
                producer.publish("bulky", b"connected")
                portal.call(proxy.half_open)

                def publish(k: int) -> None:
                    try:
                        for i in range(2):
                            producer.publish("bulky", b"%d-%d:" % (k, i) + b"x" * 1000 * 1000)
                    except BaseException as exc:
                        errors.append(exc)

                workers = [threading.Thread(target=publish, args=(k,)) for k in range(8)]
                for w in workers:
                    w.start()
                time.sleep(1.0)
                portal.call(proxy.heal)
                started = time.monotonic()
                for w in workers:
                    w.join()
                took = time.monotonic() - started
    assert errors == []
    assert took < 8.0  # not publish_timeout
    with urllib.request.urlopen(f"http://{server['nsqd HTTP']}/stats?format=json&topic=bulky") as r:
        (topic,) = json.load(r)["topics"]
    assert topic["message_count"] == 17


def test_run_handlers_in_threads_and_stop(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish_many("work", [b"%d" % i for i in range(40)])
    lock = threading.Lock()
    running = peak = done = 0
    failed_once: set[bytes] = set()

    def handler(message: Message) -> None:
        nonlocal running, peak, done
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        if message.body == b"7" and message.body not in failed_once:
            failed_once.add(message.body)
            raise ValueError("requeued, then done")
        with lock:
            done += 1

    with Consumer(
        "work",
        "c",
        nsqd_tcp_addresses=[nsqd],
        max_in_flight=20,
        default_requeue_delay=0.0,
        backoff=False,
    ) as consumer:

        def stop_when_done() -> None:
            while done < 40:
                time.sleep(0.02)
            consumer.stop()

        stopper = threading.Thread(target=stop_when_done)
        stopper.start()
        started = time.monotonic()
        consumer.run(handler, threads=4)
        stopper.join()
        assert time.monotonic() - started < 10
    assert peak == 4 and done == 40
    stats = channel_stats(server["nsqd HTTP"], "work", "c")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 1)


def _child(nsqd: str, producer: Producer, out: Any) -> None:
    with producer:
        producer.publish("forked", b"from the child %d" % os.getpid())
    out.put("ok")


def test_an_object_made_before_a_fork_works_in_the_child(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    producer = Producer(nsqd_tcp_addresses=[nsqd])  # no thread yet: that starts in 'with'
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [ctx.Process(target=_child, args=(nsqd, producer, out)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(30)
    assert [out.get(timeout=5) for _ in children] == ["ok", "ok"]
    assert all(child.exitcode == 0 for child in children)


SCRIPT = """
import sys, time
from nsq_anyio.blocking import Consumer

def handler(message):
    print("handling", flush=True)
    time.sleep(0.3)

with Consumer("slow", "c", nsqd_tcp_addresses=[sys.argv[1]], max_in_flight=5) as consumer:
    consumer.run(handler, threads=2)
"""


def test_ctrl_c_stops_gracefully_and_loses_nothing(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish_many("slow", [b"%d" % i for i in range(30)])
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT, nsqd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_in_a_terminal,
    )
    try:
        assert proc.stdout is not None
        # two handler threads print at once: the line may hold "handling" twice
        assert "handling" in proc.stdout.readline()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            # where it waits: faulthandler prints every thread's stack on SIGABRT
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"still running 30 s after Ctrl-C; its threads:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    stats = channel_stats(server["nsqd HTTP"], "slow", "c")
    # what was handled was finished, the rest requeued at once: nothing in flight, nothing lost
    assert stats["in_flight_count"] == 0 and stats["message_count"] == 30
    finished = 30 - stats["depth"]
    assert 1 <= finished < 30


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_either_event_loop(server: dict[str, str], backend: str) -> None:
    with Producer(nsqd_tcp_addresses=[server["nsqd TCP"]], backend=backend) as producer:
        producer.publish("loops", backend.encode())


def test_a_finish_is_handed_over_without_waiting_and_counted_before_the_next_call(
    server: dict[str, str],
) -> None:
    """``finish()`` returns without waiting for the loop, yet what the thread asks next
    (its next message, the stats) comes after it; a second answer raises in the thread."""
    nsqd = server["nsqd TCP"]
    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish_many("handed", [b"%d" % i for i in range(200)])
    finished = 0
    with Consumer("handed", "c", nsqd_tcp_addresses=[nsqd], max_in_flight=50) as consumer:
        for message in consumer:
            message.finish()
            finished += 1
            if finished % 50 == 0:
                assert consumer.stats()["messages_finished"] == finished
            if finished == 200:
                with pytest.raises(LocalProtocolError, match="already been answered"):
                    message.finish()
                assert message.has_responded
                break
    stats = channel_stats(server["nsqd HTTP"], "handed", "c")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_callback_handed_to_the_loop_by_a_thread_can_start_a_task(backend: str) -> None:
    """A FIN or a publish from a thread runs as a callback of the loop, not in a task, and
    may start one (a write that waits for room, a close): anyio must know the loop there."""
    from nsq_anyio.blocking import _call_soon_threadsafe

    done = threading.Event()
    seen: list[object] = []

    async def task() -> None:
        seen.append("task ran")
        done.set()

    async def group() -> None:
        async with anyio.create_task_group() as tg:

            def callback() -> None:
                try:
                    tg.start_soon(task)
                except BaseException as exc:
                    seen.append(exc)
                    done.set()

            soon = await _call_soon_threadsafe()
            threading.Thread(target=soon, args=(callback,)).start()
            await anyio.to_thread.run_sync(done.wait, 5.0)

    with anyio.from_thread.start_blocking_portal(backend) as portal:
        portal.call(group)
    assert seen == ["task ran"]


def test_callbacks_handed_over_while_the_loop_is_busy_wake_it_once_and_all_run_in_order() -> None:
    from nsq_anyio.blocking import _Handoff

    wakes: list[Any] = []
    ran: list[int] = []
    handoff = _Handoff(wakes.append)
    for i in range(5):
        handoff(partial(ran.append, i))
    assert len(wakes) == 1 and ran == []  # one wake-up for the five
    wakes.pop()()  # the loop runs it
    assert ran == [0, 1, 2, 3, 4]
    handoff(lambda: ran.append(5))  # the loop is idle again: a new wake-up
    assert len(wakes) == 1
    wakes.pop()()
    assert ran == [0, 1, 2, 3, 4, 5]


def test_a_callback_that_raises_does_not_keep_the_others_from_running() -> None:
    from nsq_anyio.blocking import _Handoff

    wakes: list[Any] = []
    ran: list[int] = []
    handoff = _Handoff(wakes.append)

    def bad() -> None:
        raise RuntimeError("bad callback")

    handoff(lambda: ran.append(0))
    handoff(bad)
    handoff(lambda: ran.append(2))
    with pytest.raises(RuntimeError, match="bad callback"):
        wakes.pop()()
    assert ran == [0] and len(wakes) == 1  # the rest in a call of their own
    wakes.pop()()
    assert ran == [0, 2] and wakes == []


def test_threads_handing_over_at_once_each_get_every_callback_run_once() -> None:
    import asyncio

    from nsq_anyio.blocking import _Handoff

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        handoff = _Handoff(loop.call_soon_threadsafe)
        seen: list[tuple[int, int]] = []

        def work(n: int) -> None:
            for i in range(200):
                done = threading.Event()

                def note(i: int = i, done: threading.Event = done) -> None:
                    seen.append((n, i))
                    done.set()

                handoff(note)
                assert done.wait(10)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(seen) == [(n, i) for n in range(20) for i in range(200)]
        for n in range(20):  # each thread's in the order it gave them
            assert [i for m, i in seen if m == n] == list(range(200))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()
