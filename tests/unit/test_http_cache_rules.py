"""What names an answer (api/httpcache.py canonical) and when memory's answers change
(api/hotboards.py): two different requests never share a canonical form, and a marker that moves
a hot board's seq makes its kept answers stale."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from api.hotboards import HotBoard
from api.httpcache import canonical
from api.routes import TOP_PARAMS
from common.cache_records import RecordWriter, decode
from common.store.encoding import TieMode


def form(path: str) -> str:
    return canonical(make_mocked_request("GET", path), TOP_PARAMS)


def test_reordered_and_unknown_parameters_share_a_form_and_different_requests_do_not():
    assert form("/v1/boards/g:a/top?limit=5&order=desc") == form(
        "/v1/boards/g:a/top?utm=x&order=desc&limit=5"
    )
    # a member id holding "&offset=5" is not an offset; a member id holding "/" is not a route
    assert form("/v1/boards/g:a/top?me=a%26offset%3D5") != form("/v1/boards/g:a/top?me=a&offset=5")
    assert form("/v1/boards/g:a/members/a%2Faround") != form("/v1/boards/g:a/members/a/around")
    assert form("/v1/boards/g:a/top?limit=5&limit=6") == form("/v1/boards/g:a/top?limit=5")  # the first


def test_a_marker_that_moves_the_seq_makes_kept_answers_stale_and_settles_memory():
    hot = HotBoard("g:a", ("total",), desc=True, mode=TieMode.INV)
    hot.finish_loading()
    writer = RecordWriter(2)
    hot.apply(decode(*writer.state("g:a", "total", "m", score=1.0, tie_ms=1, seq=5, meta=None)))
    assert hot.settled_seqs() is None  # a batch half applied: its marker not yet in
    version = hot.version
    hot.apply(decode(*writer.marker("g:a", 5)))
    assert hot.version > version and hot.settled_seqs() == [5]
    version = hot.version
    hot.apply(decode(*writer.marker("g:a", 7)))  # a change of a window this node does not hold
    assert hot.version > version and hot.seq == 7 and hot.settled_seqs() == [7]
