"""Where the time of a consume run goes, by stage, from a py-spy profile.

    py-spy record -r 1000 --format raw -o sub.txt -- \
        python benchmarks/throughput.py sub --nsqd-tcp-address 127.0.0.1:4150 --count 300000
    python benchmarks/profile_breakdown.py sub.txt

Each sample is counted where it was taken (its innermost Python frame, the calls into C it
makes included) and put in one stage: decoding frames into messages, the core's books (in
flight, RDY, timers, its outputs), the handler dispatch (the worker loop, the handler, the
finish call), the application's message object and the inbox, the runner carrying the
core's outputs to the stream, the adapter and anyio, the event loop (select, callbacks, task
switches: asyncio's or trio's own code). Only the samples under the consuming phase count
(``--phase``: a frame every one of them has; by default ``anyio.run``'s, which the filling
of the topic beforehand does not go through).
"""

from __future__ import annotations

import argparse
import collections
import re

_FRAME = re.compile(r"(.*) \((.*?):\d+\)$")

#: (stage, test on (function, file)), the first that matches
_STAGES: list[tuple[str, str, str]] = [
    # (stage, file pattern, function pattern)
    ("decoding frames into messages", r"nsq_proto/_connection\.py$", r"frame|receive|decode"),
    ("decoding frames into messages", r"nsq_proto/(_frames|_message|wire)\.py$", r""),
    ("FIN and RDY encoding", r"nsq_proto/(_connection|commands)\.py$", r""),
    ("the core's books (in flight, RDY, timers, outputs)", r"nsq_proto/", r""),
    ("the message object and the inbox", r"nsq_client/_message\.py$", r""),
    ("handler dispatch (worker, handler, finish call)", r"nsq_client/_consumer\.py$", r""),
    ("handler dispatch (worker, handler, finish call)", r"benchmarks/throughput\.py$", r""),
    ("handler dispatch (worker, handler, finish call)", r"throughput\.py$", r""),
    ("the runner (outputs to the stream)", r"nsq_client/_runner\.py$", r""),
    ("the adapter and anyio", r"(nsq_anyio|nsq_trio|anyio)/", r""),
    (
        "the event loop (select, callbacks, task switches)",
        r"(asyncio/|trio/|selectors\.py|socket\.py|outcome/|attr/|sniffio/|sortedcontainers/"
        r"|<attrs generated|contextlib\.py)",
        r"",
    ),
]


def stage(frame: str) -> str:
    match = _FRAME.match(frame)
    function, path = (match.group(1), match.group(2)) if match else (frame, "")
    for name, file_pattern, function_pattern in _STAGES:
        if re.search(file_pattern, path) and re.search(function_pattern, function):
            return name
    return "other (imports, the standard library)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", help="py-spy's --format raw output")
    parser.add_argument("--phase", default="run (anyio/_core/_eventloop.py")
    parser.add_argument("--top", type=int, default=10, help="the innermost frames to list")
    args = parser.parse_args()
    stages: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.profile) as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if args.phase not in stack:
                continue
            n = int(count)
            innermost = stack.rsplit(";", 1)[-1]
            total += n
            stages[stage(innermost)] += n
            frames[innermost] += n
    if not total:
        raise SystemExit(f"no sample under {args.phase!r}")
    print(f"samples: {total}")
    for name, n in stages.most_common():
        print(f"{100 * n / total:5.1f} %  {name}")
    print("innermost frames:")
    for name, n in frames.most_common(args.top):
        print(f"{100 * n / total:5.1f} %  {name}")


if __name__ == "__main__":
    main()
