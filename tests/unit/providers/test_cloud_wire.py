"""The cloud providers' wire pieces: AWS event-stream framing, SigV4 against botocore's
signer, and the data-line SSE source of Gemini streams."""

from __future__ import annotations

import datetime
import itertools
import struct
import zlib
from typing import Any

import httpx
import orjson
import pytest
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from triogate.errors import ProviderProtocolError
from triogate.providers import bedrock_eventstream as es
from triogate.providers.sigv4 import AwsCredentials, sign
from triogate.providers.sse_data import DataLineSource
from triogate.testing.fakebedrock import encode_message

MESSAGES = [encode_message({":event-type": "contentBlockDelta", ":message-type": "event"},
                              orjson.dumps({"delta": {"text": f" w{i}"}})) for i in range(5)]


def decode(*chunks: bytes) -> list[es.EventMessage]:
    decoder = es.EventStreamDecoder()
    out = [m for chunk in chunks for m in decoder.feed(chunk)]
    decoder.close()
    return out


def test_messages_decode_with_their_headers_and_payloads() -> None:
    (message,) = decode(MESSAGES[0])
    assert message.headers == {":event-type": "contentBlockDelta", ":message-type": "event"}
    assert orjson.loads(message.payload) == {"delta": {"text": " w0"}}


@given(st.lists(st.integers(min_value=1, max_value=len(b"".join(MESSAGES)) - 1), max_size=12))
def test_any_split_into_reads_gives_the_same_messages(cuts: list[int]) -> None:
    whole = b"".join(MESSAGES)
    points = [0, *sorted(set(cuts)), len(whole)]
    chunks = [whole[a:b] for a, b in itertools.pairwise(points)]
    assert [m.payload for m in decode(*chunks)] == [m.payload for m in decode(whole)]
    assert len(decode(*chunks)) == 5


def test_every_header_type_is_read() -> None:
    def header(name: bytes, kind: int, value: bytes) -> bytes:
        return bytes([len(name)]) + name + bytes([kind]) + value

    head = b"".join([
        header(b"t", 0, b""), header(b"f", 1, b""), header(b"b", 2, b"\x05"),
        header(b"s", 3, struct.pack(">h", -2)), header(b"i", 4, struct.pack(">i", 7)),
        header(b"l", 5, struct.pack(">q", 9)),
        header(b"y", 6, struct.pack(">H", 2) + b"\x00\x01"),
        header(b"z", 7, struct.pack(">H", 2) + b"ok"),
        header(b"ts", 8, struct.pack(">q", 1000)), header(b"u", 9, bytes(16))])
    total = 16 + len(head)
    prelude = struct.pack(">II", total, len(head))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + head
    (message,) = decode(body + struct.pack(">I", zlib.crc32(body)))
    assert message.headers == {"t": True, "f": False, "b": 5, "s": -2, "i": 7, "l": 9,
                               "y": b"\x00\x01", "z": "ok", "ts": 1000, "u": bytes(16)}


def test_a_corrupt_message_is_refused() -> None:
    bad = bytearray(MESSAGES[0])
    bad[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
    with pytest.raises(ProviderProtocolError, match="message CRC"):
        decode(bytes(bad))
    bad = bytearray(MESSAGES[0])
    bad[2] ^= 0x01  # the length: the prelude CRC no longer matches
    with pytest.raises(ProviderProtocolError, match="prelude CRC"):
        decode(bytes(bad))


def test_a_message_over_the_bound_is_refused_before_it_is_buffered() -> None:
    prelude = struct.pack(">II", es.MAX_MESSAGE_BYTES + 1, 0)
    decoder = es.EventStreamDecoder()
    with pytest.raises(ProviderProtocolError, match="bad size"):
        decoder.feed(prelude + struct.pack(">I", zlib.crc32(prelude)))


def test_a_stream_cut_inside_a_message_is_an_error() -> None:
    decoder = es.EventStreamDecoder()
    assert decoder.feed(MESSAGES[0][:-3]) == []
    assert decoder.pending == len(MESSAGES[0]) - 3
    with pytest.raises(ProviderProtocolError, match="ended inside"):
        decoder.close()


# --------------------------------------------------------------------------- SigV4


def botocore_signature(url: str, headers: dict[str, str], body: bytes, *,
                       token: str | None) -> str:
    signed = headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    request = AWSRequest(method="POST", url=url, data=body,
                         headers={n: headers[n] for n in signed})
    request.context["timestamp"] = headers["x-amz-date"]
    signer = SigV4Auth(Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", token), "bedrock",
                       "eu-west-3")
    canonical = signer.canonical_request(request)
    signature: str = signer.signature(signer.string_to_sign(request, canonical), request)
    return signature


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE//session"])
@pytest.mark.parametrize("url", [
    "https://bedrock-runtime.eu-west-3.amazonaws.com/model/"
    "anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse",
    "http://127.0.0.1:8042/model/arn%3Aaws%3Abedrock%3Aeu-west-3%3A1%3Ainference-profile"
    "%2Feu.meta.llama3-2-1b-instruct-v1%3A0/converse-stream",
])
def test_the_signature_is_the_one_botocore_computes(url: str, token: str | None) -> None:
    body = orjson.dumps({"messages": [{"role": "user", "content": [{"text": "hi  there"}]}]})
    now = datetime.datetime(2026, 3, 1, 12, 30, 5, tzinfo=datetime.UTC)
    headers = sign("POST", url, {"Content-Type": "application/json",
                                 "accept": "application/vnd.amazon.eventstream"}, body,
                   credentials=AwsCredentials(access_key_id="AKIDEXAMPLE",
                                              secret_access_key="wJalrXUtnFEMI/K7MDENG",
                                              session_token=token),
                   region="eu-west-3", service="bedrock", now=now)
    assert headers["x-amz-date"] == "20260301T123005Z"
    assert headers["host"] == httpx.URL(url).netloc.decode()
    assert ("x-amz-security-token" in headers) == (token is not None)
    assert headers["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260301/eu-west-3/bedrock/aws4_request, ")
    signature = headers["authorization"].rsplit("Signature=", 1)[1]
    assert signature == botocore_signature(url, headers, body, token=token)
    tampered = botocore_signature(url, headers, body + b" ", token=token)
    assert signature != tampered


# --------------------------------------------------------------------------- data-line SSE


async def events_of(*chunks: bytes) -> list[dict[str, Any]]:
    async def body() -> Any:
        for chunk in chunks:
            yield chunk

    response = httpx.Response(200, content=body())
    source = DataLineSource(response)
    out = []
    while (event := await source.next_event()) is not None:
        out.append(event)
    return out


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
async def test_data_lines_with_any_line_ending(ending: bytes) -> None:
    raw = ending.join([b": comment", b"event: x", b'data: {"a":', b'data: 1}', b"",
                       b'data:{"b":2}', b"", b""])
    assert await events_of(raw) == [{"a": 1}, {"b": 2}]
    split = [raw[i:i + 1] for i in range(len(raw))]  # a byte per read
    assert await events_of(*split) == [{"a": 1}, {"b": 2}]


async def test_an_unterminated_last_event_still_counts() -> None:
    assert await events_of(b'data: {"a": 1}\r\n\r\ndata: {"b": 2}') == [{"a": 1}, {"b": 2}]


async def test_data_that_is_not_an_object_is_a_protocol_error() -> None:
    with pytest.raises(ProviderProtocolError, match="not a JSON object"):
        await events_of(b"data: [1, 2]\n\n")
