from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_proto import InvalidName, LocalProtocolError, LookupdError
from nsq_proto._lookupd import (
    ACCEPT_V1,
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_USER_AGENT,
    MAX_CHANNELS,
    MAX_LOOKUPD_NODES,
    MAX_PARTITIONS,
    HttpResponseParser,
    LookupdNode,
    LookupResult,
    ParsedHttpResponse,
    Peer,
    TopicMeta,
    build_listlookup_request,
    build_lookup_request,
    parse_listlookup_response,
    parse_lookup_response,
    partition_addresses,
    union_producers,
)
from nsq_proto.wire import is_valid_topic_name

FIXTURE_DIR = Path(__file__).resolve().parents[2] / "spec-fixtures" / "lookupd"
FIXTURES = sorted(FIXTURE_DIR.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(path.read_text())
    return case


def case_body(case: dict[str, Any]) -> bytes:
    if "body_hex" in case:
        return bytes.fromhex(case["body_hex"])
    body: str = case["body"]
    return body.encode("utf-8")


def producer_json(producer: Peer) -> dict[str, Any]:
    return dataclasses.asdict(producer)


def lookup_json(result: LookupResult) -> dict[str, Any]:
    return {
        "producers": [producer_json(p) for p in result.producers],
        "channels": list(result.channels),
        "partitions": {str(k): producer_json(v) for k, v in sorted(result.partitions.items())},
        "meta": None if result.meta is None else dataclasses.asdict(result.meta),
    }


def parse(parser: str, status: int, body: bytes) -> Any:
    if parser == "lookup":
        return lookup_json(parse_lookup_response(status, body))
    assert parser == "listlookup"
    return [dataclasses.asdict(node) for node in parse_listlookup_response(status, body)]


def feed(parser: HttpResponseParser, chunks: list[bytes]) -> list[ParsedHttpResponse]:
    out = []
    for chunk in chunks:
        response = parser.receive_data(chunk)
        if response is not None:
            out.append(response)
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts``, with no empty piece (``b""`` means EOF to the parser)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return [piece for piece in out if piece]


# --------------------------------------------------------------------------------------------
# fixtures


def test_fixtures_exist_and_are_documented() -> None:
    assert len(FIXTURES) >= 100
    for path in FIXTURES:
        case = load(path)
        assert next(iter(case)) == "source", path.name
        assert case["parser"] in ("lookup", "listlookup")
        assert ("body" in case) != ("body_hex" in case)
        assert list(case["expect"]) in (["result"], ["error"])


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture(path: Path) -> None:
    case = load(path)
    body = case_body(case)
    expect = case["expect"]
    if "error" in expect:
        with pytest.raises(LookupdError) as info:
            parse(case["parser"], case["status"], body)
        assert expect["error"] in str(info.value)
    else:
        assert parse(case["parser"], case["status"], body) == expect["result"]


@pytest.mark.parametrize("depth", [500, 512, 513, 2_000, 9_000])
def test_nesting_limit_is_the_same_on_every_python(depth: int) -> None:
    # the json module's own limit moved with Python 3.13: the core checks depth itself
    ignored = "[" * (depth - 1) + "]" * (depth - 1)  # inside the answer's object
    body = f'{{"producers": [], "x": {ignored}, "s": "[[[[{{{{"}}'.encode()
    if depth <= 512:
        assert parse("lookup", 200, body) == parse("lookup", 200, b'{"producers": []}')
    else:
        with pytest.raises(LookupdError, match="nested too deeply"):
            parse("lookup", 200, body)


HTTP_FIXTURES = [p for p in FIXTURES if "http_response_hex" in load(p)]


@pytest.mark.parametrize("path", HTTP_FIXTURES, ids=[p.stem for p in HTTP_FIXTURES])
def test_fixture_http_response_whole_and_byte_by_byte(path: Path) -> None:
    case = load(path)
    data = bytes.fromhex(case["http_response_hex"])
    whole = feed(HttpResponseParser(), [data, b""])
    assert len(whole) == 1
    assert whole[0].status == case["status"]
    assert whole[0].body == case_body(case)
    assert (b"connection", b"close") in whole[0].headers
    one_by_one = feed(HttpResponseParser(), [data[i : i + 1] for i in range(len(data))] + [b""])
    assert one_by_one == whole


LOOKUPD_CAPTURES = [
    "lookupd_channels.json",
    "lookupd_info.json",
    "lookupd_lookup.json",
    "lookupd_lookup_accept_v1.json",
    "lookupd_lookup_missing_topic.json",
    "lookupd_lookup_no_topic.json",
    "lookupd_nodes.json",
    "lookupd_not_found.json",
    "lookupd_ping.json",
    "lookupd_topics.json",
]


def test_http_fixtures_cover_every_lookupd_capture() -> None:
    sources = {load(p)["source"] for p in HTTP_FIXTURES}
    assert sources == {f"shared/spec/captures/{name}" for name in LOOKUPD_CAPTURES}


REQUEST_FIXTURES = [p for p in FIXTURES if "request" in load(p)]


@pytest.mark.parametrize("path", REQUEST_FIXTURES, ids=[p.stem for p in REQUEST_FIXTURES])
def test_fixture_request_is_byte_exact(path: Path) -> None:
    request = dict(load(path)["request"])
    expected = bytes.fromhex(request.pop("hex"))
    assert build_lookup_request(**request) == expected


# --------------------------------------------------------------------------------------------
# requests


def test_listlookup_request() -> None:
    assert build_listlookup_request("10.0.0.1", 4161, user_agent="ua/1") == (
        b"GET /listlookup HTTP/1.1\r\nHost: 10.0.0.1:4161\r\nUser-Agent: ua/1\r\n"
        b"Accept: application/vnd.nsq; version=1.0\r\nConnection: close\r\n\r\n"
    )


def test_partitioned_lookup_request() -> None:
    data = build_lookup_request(
        "lookupd", 4161, "orders#ephemeral", access="w", metainfo=True, partition=3
    )
    assert data.startswith(
        b"GET /lookup?topic=orders%23ephemeral&access=w&metainfo=true&partition=3 HTTP/1.1\r\n"
    )
    assert f"User-Agent: {DEFAULT_USER_AGENT}\r\n".encode() in data


def test_ipv6_host_header_is_bracketed() -> None:
    assert b"Host: [::1]:4161\r\n" in build_lookup_request("::1", 4161, "t")
    assert b"Host: [::1]:4161\r\n" in build_listlookup_request("[::1]", 4161)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topic": "bad topic"}, "topic name"),
        ({"topic": "x" * 65}, "topic name"),
        ({"access": "rw"}, "access must be"),
        ({"partition": -1}, "partition -1"),
        ({"partition": True}, "partition True"),
        ({"port": 0}, "port 0"),
        ({"port": 65536}, "port 65536"),
        ({"host": ""}, "host ''"),
        ({"host": "a b"}, "host 'a b'"),
        ({"host": "a\r\nX: y"}, "host"),
        ({"user_agent": "ua\r\nX: y"}, "cannot build"),
    ],
)
def test_bad_request_arguments(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"host": "127.0.0.1", "port": 4161, "topic": "t"}
    args.update(kwargs)
    with pytest.raises(LocalProtocolError, match=message):
        build_lookup_request(**args)


def test_bad_topic_is_invalid_name() -> None:
    with pytest.raises(InvalidName):
        build_lookup_request("127.0.0.1", 4161, "")


topics = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}(#ephemeral)?", fullmatch=True).filter(
    is_valid_topic_name
)
hosts = st.sampled_from(["127.0.0.1", "localhost", "::1", "fe80::1", "lookupd-1.example.com"]) | (
    st.from_regex(r"[a-z0-9][a-z0-9.-]{0,40}", fullmatch=True)
)


@settings(max_examples=150, deadline=None)
@given(
    topic=topics,
    host=hosts,
    port=st.integers(1, 65535),
    access=st.sampled_from([None, "r", "w"]),
    metainfo=st.booleans(),
    partition=st.none() | st.integers(0, 2**31 - 1),
    user_agent=st.from_regex(r"[ -~]{1,40}", fullmatch=True).map(str.strip).filter(bool),
)
def test_request_parses_back(
    topic: str,
    host: str,
    port: int,
    access: str | None,
    metainfo: bool,
    partition: int | None,
    user_agent: str,
) -> None:
    data = build_lookup_request(
        host,
        port,
        topic,
        access=access,
        metainfo=metainfo,
        partition=partition,
        user_agent=user_agent,
    )
    server = h11.Connection(h11.SERVER)
    server.receive_data(data)
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert isinstance(server.next_event(), h11.EndOfMessage)
    assert request.method == b"GET"
    assert request.http_version == b"1.1"
    target = urlsplit(request.target.decode("ascii"))
    assert target.path == "/lookup"
    expected_query = {"topic": [topic]}
    if access is not None:
        expected_query["access"] = [access]
    if metainfo:
        expected_query["metainfo"] = ["true"]
    if partition is not None:
        expected_query["partition"] = [str(partition)]
    assert parse_qs(target.query, keep_blank_values=True, strict_parsing=True) == expected_query
    host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert list(request.headers) == [
        (b"host", host_header.encode()),
        (b"user-agent", user_agent.encode()),
        (b"accept", ACCEPT_V1.encode()),
        (b"connection", b"close"),
    ]


# --------------------------------------------------------------------------------------------
# HTTP responses


def render(status: int, body: bytes, framing: str, chunk_size: int) -> bytes:
    head = f"HTTP/1.1 {status} Whatever\r\nX-Nsq-Content-Type: nsq; version=1.0\r\n"
    if framing == "length":
        return f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    if framing == "close":
        return f"{head}Connection: close\r\n\r\n".encode() + body
    out = [f"{head}Transfer-Encoding: chunked\r\n\r\n".encode()]
    for i in range(0, len(body), chunk_size):
        piece = body[i : i + chunk_size]
        out.append(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    out.append(b"0\r\n\r\n")
    return b"".join(out)


@settings(max_examples=150, deadline=None)
@given(
    status=st.sampled_from([200, 400, 404, 500, 503]),
    body=st.binary(max_size=300),
    framing=st.sampled_from(["length", "close", "chunked"]),
    chunk_size=st.integers(1, 64),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_response_parser_is_chunking_invariant(
    status: int, body: bytes, framing: str, chunk_size: int, cuts: list[int]
) -> None:
    data = render(status, body, framing, chunk_size)
    whole = feed(HttpResponseParser(), [data, b""])
    assert len(whole) == 1
    assert whole[0].status == status
    assert whole[0].body == body
    assert feed(HttpResponseParser(), [*split(data, cuts), b""]) == whole


def test_response_without_eof_completes_when_length_is_known() -> None:
    parser = HttpResponseParser()
    response = parser.receive_data(render(200, b"{}", "length", 1))
    assert response == ParsedHttpResponse(
        200,
        [
            (b"x-nsq-content-type", b"nsq; version=1.0"),
            (b"content-length", b"2"),
            (b"connection", b"close"),
        ],
        b"{}",
    )
    assert parser.response == response
    # anything after the complete response is ignored, including EOF
    assert parser.receive_data(b"garbage") is None
    assert parser.receive_data(b"") is None
    assert parser.response == response


def test_close_delimited_body_needs_eof() -> None:
    parser = HttpResponseParser()
    assert parser.receive_data(render(200, b"abc", "close", 1)) is None
    response = parser.receive_data(b"")
    assert response is not None and response.body == b"abc"


def test_informational_response_is_skipped() -> None:
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + render(200, b"ok", "length", 1)
    assert [r.status for r in feed(HttpResponseParser(), [data])] == [200]


@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_body_size_is_capped(framing: str) -> None:
    parser = HttpResponseParser(max_body_size=10)
    assert feed(parser, [render(200, b"x" * 10, framing, 3), b""])[0].body == b"x" * 10
    parser = HttpResponseParser(max_body_size=10)
    with pytest.raises(LookupdError, match="above the limit of 10 bytes"):
        feed(parser, [render(200, b"x" * 11, framing, 3), b""])
    # the parser stays broken
    with pytest.raises(LookupdError, match="above the limit"):
        parser.receive_data(b"")


def test_declared_length_above_cap_fails_before_the_body() -> None:
    parser = HttpResponseParser(max_body_size=100)
    with pytest.raises(LookupdError, match="1000000 bytes is above"):
        parser.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")


def test_default_cap_is_four_mib() -> None:
    assert DEFAULT_MAX_BODY_SIZE == 4 * 1024 * 1024
    with pytest.raises(LookupdError, match="above the limit"):
        HttpResponseParser().receive_data(
            f"HTTP/1.1 200 OK\r\nContent-Length: {DEFAULT_MAX_BODY_SIZE + 1}\r\n\r\n".encode()
        )
    with pytest.raises(ValueError):
        HttpResponseParser(max_body_size=-1)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([b"garbage\r\n\r\n"], "malformed HTTP response"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"], "malformed HTTP response"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b""], "closed before the end"),
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", b""], "before the end"),
        ([b"HTTP/1.1 200 O", b""], "closed before the end"),
        ([b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 5000], "malformed HTTP response"),
        ([b""], "closed before an HTTP response"),
    ],
)
def test_bad_http_is_lookupd_error(chunks: list[bytes], message: str) -> None:
    parser = HttpResponseParser()
    with pytest.raises(LookupdError, match=message):
        feed(parser, chunks)
    with pytest.raises(LookupdError, match=message):
        parser.receive_data(b"more")


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5"]),
    data=st.binary(max_size=200),
    cuts=st.lists(st.integers(0, 300), max_size=5),
)
def test_arbitrary_bytes_give_a_response_or_lookupd_error(
    prefix: bytes, data: bytes, cuts: list[int]
) -> None:
    parser = HttpResponseParser(max_body_size=100)
    try:
        responses = feed(parser, [*split(prefix + data, cuts), b""])
    except LookupdError:
        return
    assert len(responses) <= 1


# --------------------------------------------------------------------------------------------
# results and their combination


def producer(address: str, port: int = 4150, version: str = "1.3.0") -> Peer:
    return Peer(
        broadcast_address=address, tcp_port=port, http_port=4151, hostname="h", version=version
    )


def test_producer_address_and_key() -> None:
    p = producer("10.0.0.1", 4150)
    assert p.address == ("10.0.0.1", 4150)
    assert p.key == "10.0.0.1:4150"
    assert p.distributed_id is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.tcp_port = 1  # type: ignore[misc]


def test_union_producers_keys_by_address_and_port() -> None:
    a1 = producer("a", 4150, "1.0")
    a1_again = producer("a", 4150, "2.0")
    a2 = producer("a", 4250)
    b = producer("b")
    results = [
        LookupResult(producers=(a1, b)),
        LookupResult(),
        LookupResult(producers=(a1_again, a2)),
    ]
    union = union_producers(iter(results))
    assert union == {"a:4150": a1, "b:4150": b, "a:4250": a2}
    assert union_producers([]) == {}


def test_partition_addresses_merges_answers() -> None:
    first = parse_lookup_response(
        200, case_body(load(FIXTURE_DIR / "partitioned_lookup_metainfo.json"))
    )
    assert partition_addresses([first]) == {0: ("10.0.0.1", 4150), 1: ("10.0.0.2", 4150)}
    other = LookupResult(partitions={1: producer("10.9.9.9"), 2: producer("10.0.0.3")})
    assert partition_addresses([first, other]) == {
        0: ("10.0.0.1", 4150),
        1: ("10.0.0.2", 4150),
        2: ("10.0.0.3", 4150),
    }
    assert partition_addresses([LookupResult()]) == {}


def test_results_are_immutable_and_hashable() -> None:
    result = parse_lookup_response(
        200, case_body(load(FIXTURE_DIR / "partitioned_lookup_metainfo.json"))
    )
    with pytest.raises(TypeError):
        result.partitions[5] = producer("x")  # type: ignore[index]
    assert isinstance(hash(result), int)
    assert result.meta == TopicMeta(partition_num=2, replica=2, extend_support=True)
    assert LookupResult(topic_found=False) == parse_lookup_response(
        404, b'{"message":"TOPIC_NOT_FOUND"}'
    )


def test_lookupd_node_http_address() -> None:
    node = LookupdNode(node_ip="10.0.0.1", http_port=4161)
    assert node.http_address == ("10.0.0.1", 4161)


@pytest.mark.parametrize(
    ("parser", "body", "message"),
    [
        ("lookup", {"producers": [], "channels": ["c"] * (MAX_CHANNELS + 1)}, "channels has"),
        (
            "lookup",
            {"producers": [], "partitions": {str(i): 0 for i in range(MAX_PARTITIONS + 1)}},
            "partitions has",
        ),
        ("listlookup", {"lookupdnodes": [0] * (MAX_LOOKUPD_NODES + 1)}, "lookupdnodes has"),
    ],
)
def test_absurd_sizes(parser: str, body: object, message: str) -> None:
    with pytest.raises(LookupdError, match=message):
        parse(parser, 200, json.dumps(body).encode())


def test_limits_are_inclusive() -> None:
    body = {"producers": [], "channels": ["c"] * MAX_CHANNELS}
    assert len(parse_lookup_response(200, json.dumps(body).encode()).channels) == MAX_CHANNELS


@pytest.mark.parametrize("parser", ["lookup", "listlookup"])
def test_body_above_limit_is_refused_unread(parser: str) -> None:
    with pytest.raises(LookupdError, match="above the limit"):
        parse(parser, 200, b" " * (DEFAULT_MAX_BODY_SIZE + 1))


# --------------------------------------------------------------------------------------------
# hostile input: a result or LookupdError, never anything else


def outcome(parser: str, status: int, body: bytes) -> object:
    try:
        return parse(parser, status, body)
    except LookupdError as exc:
        assert str(exc)
        return exc


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-2, 70_000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["4150", "127.0.0.1", "", " ", "TOPIC_NOT_FOUND", "0.3.7-HA.1.13.0"])
)
keys = st.sampled_from(
    [
        "producers",
        "channels",
        "partitions",
        "meta",
        "status_code",
        "status_txt",
        "data",
        "message",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "hostname",
        "version",
        "distributed_id",
        "partition_num",
        "replica",
        "ordered",
        "extend_support",
        "lookupdnodes",
        "lookupdleader",
        "NodeIP",
        "HttpPort",
        "TcpPort",
        "RpcPort",
        "ID",
        "0",
        "1",
        "-1",
    ]
) | st.text(max_size=6)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=6),
    max_leaves=40,
)
statuses = st.sampled_from([200, 200, 200, 404, 500]) | st.integers(100, 599)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parser=st.sampled_from(["lookup", "listlookup"]),
    status=statuses,
    doc=json_values,
)
def test_arbitrary_json_gives_a_result_or_lookupd_error(
    parser: str, status: int, doc: object
) -> None:
    outcome(parser, status, json.dumps(doc).encode())


@settings(max_examples=200, deadline=None)
@given(parser=st.sampled_from(["lookup", "listlookup"]), status=statuses, body=st.binary())
def test_arbitrary_bytes_give_a_result_or_lookupd_error(
    parser: str, status: int, body: bytes
) -> None:
    outcome(parser, status, body)


@settings(max_examples=200, deadline=None)
@given(
    parser=st.sampled_from(["lookup", "listlookup"]),
    doc=json_values,
    cut=st.integers(0, 10_000),
    garbage=st.binary(max_size=8),
)
def test_damaged_json_gives_a_result_or_lookupd_error(
    parser: str, doc: object, cut: int, garbage: bytes
) -> None:
    text = json.dumps(doc).encode()
    cut %= len(text) + 1
    outcome(parser, 200, text[:cut] + garbage + text[cut:])
    outcome(parser, 200, text[:cut])


# --------------------------------------------------------------------------------------------
# valid answers round-trip, bare or enveloped

host_names = st.from_regex(r"[a-z0-9][a-z0-9.:-]{0,30}", fullmatch=True)
producers_st = st.builds(
    Peer,
    broadcast_address=host_names,
    tcp_port=st.integers(1, 65535),
    http_port=st.integers(0, 65535),
    hostname=st.text(max_size=20),
    version=st.text(max_size=20),
    distributed_id=st.none() | st.text(max_size=30),
)
metas = st.none() | st.builds(
    TopicMeta,
    partition_num=st.integers(0, 2**31 - 1),
    replica=st.integers(0, 2**31 - 1),
    extend_support=st.booleans(),
    ordered=st.booleans(),
    multi_part=st.booleans(),
    disable_channel_auto_create=st.booleans(),
)


def peer_doc(p: Peer) -> dict[str, object]:
    doc = dataclasses.asdict(p)
    doc["remote_address"] = "127.0.0.1:1"
    if p.distributed_id is None:
        del doc["distributed_id"]
    return doc


@settings(max_examples=150, deadline=None)
@given(
    producers=st.lists(producers_st, max_size=5),
    channels=st.lists(st.text(max_size=20), max_size=5),
    partitions=st.dictionaries(st.integers(0, 2**31 - 1), producers_st, max_size=4),
    meta=metas,
    enveloped=st.booleans(),
)
def test_valid_lookup_answers_round_trip(
    producers: list[Peer],
    channels: list[str],
    partitions: dict[int, Peer],
    meta: TopicMeta | None,
    enveloped: bool,
) -> None:
    data: dict[str, object] = {
        "channels": channels,
        "producers": [peer_doc(p) for p in producers],
        "partitions": {str(k): peer_doc(v) for k, v in partitions.items()},
    }
    if meta is not None:
        data["meta"] = dataclasses.asdict(meta)
    doc = {"status_code": 200, "status_txt": "OK", "data": data} if enveloped else data
    result = parse_lookup_response(200, json.dumps(doc).encode())
    assert result == LookupResult(
        producers=tuple(producers), channels=tuple(channels), partitions=partitions, meta=meta
    )


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(host_names, st.integers(1, 65535), st.integers(1, 65535), st.text(max_size=20)),
        max_size=5,
    ),
    enveloped=st.booleans(),
)
def test_valid_listlookup_answers_round_trip(
    nodes: list[tuple[str, int, int, str]], enveloped: bool
) -> None:
    data = {
        "lookupdnodes": [
            {
                "ID": node_id,
                "NodeIP": ip,
                "TcpPort": str(tcp),
                "HttpPort": str(http),
                "RpcPort": str(tcp),
                "Epoch": 3,
            }
            for ip, http, tcp, node_id in nodes
        ],
        "lookupdleader": None,
    }
    doc = {"status_code": 200, "status_txt": "OK", "data": data} if enveloped else data
    assert parse_listlookup_response(200, json.dumps(doc).encode()) == tuple(
        LookupdNode(node_ip=ip, http_port=http, tcp_port=tcp, rpc_port=tcp, id=node_id)
        for ip, http, tcp, node_id in nodes
    )
