"""BodyDecoder (``_http/h1/decoding.py``): gzip and deflate undone in bounded steps."""

from __future__ import annotations

import gzip
import zlib

import pytest

from provider_router._http.h1.decoding import BodyDecoder
from provider_router._http.h1.errors import H1Error

TEXT = b'{"id":"gen-1","choices":[]}' * 50


def test_every_gzip_member_is_decoded() -> None:
    decoder = BodyDecoder("gzip")
    body = gzip.compress(TEXT[:100]) + gzip.compress(TEXT[100:])
    assert decoder.feed(body, 1 << 20) == TEXT
    decoder.finish()


def test_output_never_passes_the_limit_and_the_rest_waits() -> None:
    bomb = zlib.compress(b"0" * (8 << 20), 9, 31)
    decoder = BodyDecoder("gzip")
    first = decoder.feed(bomb, 1000)
    assert len(first) == 1000
    assert decoder.pending
    rest = decoder.more(16 << 20)
    assert len(first) + len(rest) == 8 << 20
    assert not decoder.pending
    decoder.finish()


@pytest.mark.parametrize("wbits", [15, -15])
def test_deflate_as_zlib_or_raw_fed_a_byte_at_a_time(wbits: int) -> None:
    packer = zlib.compressobj(wbits=wbits)
    body = packer.compress(TEXT) + packer.flush()
    decoder = BodyDecoder("deflate")
    out = b"".join(decoder.feed(body[i : i + 1], 1 << 20) for i in range(len(body)))
    assert out == TEXT
    decoder.finish()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_body_cut_before_its_stream_ends_is_cut_short(coding: str) -> None:
    body = gzip.compress(TEXT) if coding == "gzip" else zlib.compress(TEXT)
    decoder = BodyDecoder(coding)
    decoder.feed(body[:-6], 1 << 20)
    with pytest.raises(H1Error, match="cut short"):
        decoder.finish()


def test_garbage_is_an_error_naming_the_coding() -> None:
    with pytest.raises(H1Error, match="gzip body could not be decoded"):
        BodyDecoder("gzip").feed(b"not gzip at all", 1 << 20)
