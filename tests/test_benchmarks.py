"""Every benchmark runs, in a tiny form, against a real nsqd (and the core's alone): they are
measurements, not tests, but they must not rot.  The figures themselves are not asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import MISSING, NSQD, NSQLOOKUPD, Nsqd

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def run(*argv: str, timeout: float = 240.0) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def refused(*argv: str) -> subprocess.CompletedProcess[str]:
    """A run that must end with argparse's usage error (status 2, nothing on stdout)."""
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    return done


def figure(output: str, name: str) -> float:
    """The benchmark's ``name=<float>`` line, which must be there and be a rate above 0."""
    found = re.findall(rf"^{name}=([0-9.]+)", output, re.MULTILINE)
    assert found, output
    value = float(found[-1])
    assert value > 0
    return value


def test_the_core_benchmarks_run() -> None:
    output = run(str(BENCHMARKS / "consumer_core.py"), "--count", "20000")
    figure(output, "consumer_core_msgs_per_s_1conn")
    figure(output, "consumer_core_msgs_per_s_8conn")
    figure(run(str(BENCHMARKS / "decode.py"), "--count", "20000"), "connection_receive_fin_per_s")


@pytest.mark.parametrize("backend", ["asyncio", "trio", "nsq_trio"])
def test_the_client_path_benchmark_runs(backend: str) -> None:
    output = run(
        str(BENCHMARKS / "client_path.py"), "--backend", backend, "--count", "5000", "--rounds", "1"
    )
    for name in ("client", "parse_fin", "handler_floor"):
        figure(output, f"{name}_cpu_us_per_msg")


@pytest.mark.parametrize("backend", ["asyncio", "trio", "nsq_trio"])
def test_the_publish_path_benchmark_runs(backend: str) -> None:
    output = run(
        str(BENCHMARKS / "publish_path.py"),
        *("--backend", backend, "--publishers", "50", "--count", "5000", "--rounds", "1"),
    )
    figure(output, "client_cpu_us_per_publish")
    figure(output, "wakeup_floor_cpu_us_per_publish")


real = pytest.mark.real_nsqd


@pytest.fixture(scope="module")
def nsqd() -> Iterator[Nsqd]:
    if not (NSQD and NSQLOOKUPD):
        pytest.skip(MISSING)
    # the benchmarks' own setting: the queue in memory
    server = Nsqd("--mem-queue-size=1000000", "--sync-every=2500")
    server.start()
    yield server
    server.cleanup()


@real
@pytest.mark.parametrize("backend", ["asyncio", "trio", "nsq_trio"])
def test_the_throughput_benchmark_runs_against_a_real_nsqd(nsqd: Nsqd, backend: str) -> None:
    address = nsqd.tcp_address
    script = str(BENCHMARKS / "throughput.py")
    common = ["--nsqd-tcp-address", address, "--count", "3000", "--backend", backend]
    figure(
        run(script, "pub", *common, "--topic", f"bench_pub_{backend}", "--bare"), "pub_msgs_per_s"
    )
    # pub publishes to the topic named (the bare loop to one of its own)
    (published,) = [
        t["message_count"]
        for t in nsqd.stats(f"bench_pub_{backend}")["topics"]
        if t["topic_name"] == f"bench_pub_{backend}"
    ]
    assert published >= 3000
    figure(
        run(script, "sub", *common, "--topic", f"bench_sub_{backend}", "--bare"), "sub_msgs_per_s"
    )


@real
@pytest.mark.parametrize("backend", ["asyncio", "nsq_trio"])
def test_the_throughput_benchmark_runs_single_publishers_and_across_a_round_trip(
    nsqd: Nsqd, backend: str
) -> None:
    """``--publishers`` (tasks each awaiting one publish at a time) and ``--rtt`` (the client
    and the bare loop through the delay proxy), beside the bare loop."""
    script = str(BENCHMARKS / "throughput.py")
    common = ["--nsqd-tcp-address", nsqd.tcp_address, "--backend", backend, "--bare"]
    for rtt in ([], ["--rtt", "20"]):
        output = run(script, "pub", *common, "--publishers", "20", "--count", "400", *rtt)
        figure(output, "pub_msgs_per_s")
        figure(output, "bare_pub_msgs_per_s")
        assert "publishers=20" in output
    assert "rtt_ms=20.0" in output
    output = run(script, "sub", *common, "--concurrency", "10", "--count", "1000", "--rtt", "20")
    figure(output, "sub_msgs_per_s")
    figure(output, "bare_sub_msgs_per_s")


@real
def test_the_throughput_benchmark_prints_each_round_then_the_medians(nsqd: Nsqd) -> None:
    """``--rounds 3``: each round's client and bare rates and their ratio (the bare loop
    first in the second round), then the medians (the ratio's is the median of the rounds'
    ratios, not the ratio of the medians)."""
    script = str(BENCHMARKS / "throughput.py")
    output = run(
        script,
        "sub",
        *("--nsqd-tcp-address", nsqd.tcp_address, "--count", "1500", "--bare", "--rounds", "3"),
    )
    rounds = re.findall(
        r"^round (\d)((?: \(bare first\))?): "
        r"sub_msgs_per_s=([0-9.]+) bare_sub_msgs_per_s=([0-9.]+) ratio=([0-9.]+)$",
        output,
        re.MULTILINE,
    )
    assert [r[:2] for r in rounds] == [("1", ""), ("2", " (bare first)"), ("3", "")], output
    rates = sorted(float(r[2]) for r in rounds)
    bare_rates = sorted(float(r[3]) for r in rounds)
    ratios = sorted(float(r[2]) / float(r[3]) for r in rounds)
    assert figure(output, "sub_msgs_per_s") == pytest.approx(rates[1], abs=0.1)
    assert figure(output, "bare_sub_msgs_per_s") == pytest.approx(bare_rates[1], abs=0.1)
    (ratio,) = re.findall(r"^bare_sub_msgs_per_s=[0-9.]+ ratio=([0-9.]+)$", output, re.MULTILINE)
    assert float(ratio) == pytest.approx(ratios[1], abs=0.006)
    assert "rounds=3" in output


def test_the_throughput_benchmark_refuses_no_round() -> None:
    done = refused(str(BENCHMARKS / "throughput.py"), "sub", "--rounds", "0")
    assert "--rounds must be at least 1" in done.stderr


@real
def test_the_throughput_benchmark_runs_on_uvloop(nsqd: Nsqd) -> None:
    """``--loop uvloop``: the client (anyio's use_uvloop) and the bare loop on uvloop."""
    script = str(BENCHMARKS / "throughput.py")
    common = ["--nsqd-tcp-address", nsqd.tcp_address, "--loop", "uvloop", "--bare"]
    output = run(script, "pub", *common, "--publishers", "20", "--count", "400")
    figure(output, "pub_msgs_per_s")
    figure(output, "bare_pub_msgs_per_s")
    assert "loop=uvloop" in output
    output = run(script, "sub", *common, "--count", "2000", "--topic", "bench_uvloop")
    figure(output, "sub_msgs_per_s")
    figure(output, "bare_sub_msgs_per_s")


def test_the_profile_breakdown_sorts_samples_into_stages(tmp_path: Path) -> None:
    """A py-spy raw profile: each sample in the stage of its innermost frame, only under the
    consuming phase."""
    run_ = "main (throughput.py:203);run (anyio/_core/_eventloop.py:74)"
    profile = tmp_path / "sub.txt"
    profile.write_text(
        f"{run_};Connection._frames (nsq_proto/_connection.py:387) 6\n"
        f"{run_};Consumer.finish (nsq_proto/_consumer.py:679) 2\n"
        f"{run_};Consumer._worker (nsq_client/_consumer.py:412) 1\n"
        f"{run_};BaseEventLoop._run_once (asyncio/base_events.py:1845) 1\n"
        "main (throughput.py:188);pub (bare.py:40) 50\n"  # filling the topic: not counted
    )
    output = run(str(BENCHMARKS / "profile_breakdown.py"), str(profile))
    assert "samples: 10" in output
    assert " 60.0 %  decoding frames into messages" in output
    assert " 20.0 %  the core's books" in output
    assert " 10.0 %  handler dispatch" in output
    assert " 10.0 %  the event loop" in output


def test_the_throughput_benchmark_says_publishers_is_a_mode_of_pub() -> None:
    done = refused(str(BENCHMARKS / "throughput.py"), "sub", "--publishers", "2")
    assert done.stderr.splitlines()[-1].endswith("--publishers is a mode of pub")


@real
def test_the_latency_benchmark_runs_across_a_round_trip(nsqd: Nsqd) -> None:
    """Through the delay proxy, every round trip takes the delay: each p50 is at least 20 ms,
    the bare loop's too (it goes through the same proxy)."""
    output = run(
        str(BENCHMARKS / "latency.py"),
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--count",
        "20",
        "--rtt",
        "20",
    )
    for name in ("round_trip", "end_to_end"):
        found = re.search(rf"^{name}: client p50=(\d+)us .* bare p50=(\d+)us", output, re.M)
        assert found, output
        assert int(found[1]) >= 20_000 and int(found[2]) >= 20_000, output


@real
def test_the_latency_and_blocking_benchmarks_run_against_a_real_nsqd(nsqd: Nsqd) -> None:
    address = nsqd.tcp_address
    output = run(str(BENCHMARKS / "latency.py"), "--nsqd-tcp-address", address, "--count", "200")
    assert re.search(r"round_trip: client p50=\d+us .* bare p50=\d+us", output), output
    output = run(
        str(BENCHMARKS / "blocking_publish.py"),
        "--nsqd-tcp-address",
        address,
        "--count",
        "2000",
        "--topic",
        "bench_blocking",
    )
    figure(output, "blocking_msgs_per_s")
    figure(output, "async_msgs_per_s")
    output = run(
        str(BENCHMARKS / "blocking_publish.py"),
        "--nsqd-tcp-address",
        address,
        "--count",
        "200",
        "--threads",
        "20",
        "--rtt",
        "20",
        "--topic",
        "bench_blocking",
    )
    assert "threads=20 count=200 size=200 rtt_ms=20" in output, output
    figure(output, "blocking_msgs_per_s")
    output = run(
        str(BENCHMARKS / "blocking_consume.py"),
        "--nsqd-tcp-address",
        address,
        "--count",
        "500",
        "--topic",
        "bench_blocking_consume",
    )
    assert "threads=4 count=500 size=200 asyncio" in output, output
    figure(output, "blocking_msgs_per_s")
    figure(output, "async_msgs_per_s")


@pytest.mark.spark
def test_the_spark_benchmark_says_what_reading_on_the_executors_needs() -> None:
    pytest.importorskip("pyspark")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "spark_throughput.py"), "--nsqd-tcp-address", "h:1"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith(
        "--read-mode executors (the default) asks nsqd's HTTP API how many messages wait: "
        "give --nsqd-http-address (or --lookupd-http-address), or --read-mode driver"
    )


@pytest.mark.spark
def test_the_spark_startup_benchmark_runs() -> None:
    pytest.importorskip("pyspark")
    output = run(str(BENCHMARKS / "spark_startup.py"), "--count", "20", timeout=400.0)
    figure(output, "spark_startup_session_s")
    figure(output, "spark_startup_query_s")
    figure(output, "spark_startup_first_output_s")


@real
@pytest.mark.spark
def test_the_spark_benchmark_runs_against_a_real_nsqd(nsqd: Nsqd) -> None:
    pytest.importorskip("pyspark")
    output = run(
        str(BENCHMARKS / "spark_throughput.py"),
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--nsqd-http-address",
        f"127.0.0.1:{nsqd.http}",
        "--count",
        "20000",
        "--max-messages-per-trigger",
        "4000",
        "--memory-batch-rows",
        "4000",
        "--warmup-batches",
        "1",
        timeout=400.0,
    )
    figure(output, "spark_source_msgs_per_s")
    figure(output, "spark_sink_msgs_per_s")
