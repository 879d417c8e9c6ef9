"""Which client a request counts as (api/access.py): the peer, or behind trusted proxies the
first untrusted hop of X-Forwarded-For from the right."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from api.access import Access
from common.errors import ConfigError
from common.settings import load_settings


def _client(trusted: str, peer: str, forwarded: str | None) -> str:
    access = Access.of(load_settings({}, api_rate_limit_per_s=1.0, api_trusted_proxies=trusted))
    assert access is not None
    headers = {} if forwarded is None else {"X-Forwarded-For": forwarded}
    request = make_mocked_request("GET", "/", headers=headers)
    with mock.patch.object(type(request), "remote", new_callable=mock.PropertyMock, return_value=peer):
        return access.client_address(request)


@pytest.mark.parametrize(
    ("trusted", "peer", "forwarded", "client"),
    [
        ("", "198.51.100.1", "203.0.113.7", "198.51.100.1"),  # no proxy trusted: the header is ignored
        ("10.0.0.0/8", "198.51.100.1", "203.0.113.7", "198.51.100.1"),  # the peer is no proxy of ours
        ("10.0.0.0/8", "10.0.0.5", "203.0.113.7", "203.0.113.7"),
        ("10.0.0.0/8", "10.0.0.5", "192.0.2.1, 203.0.113.7, 10.9.9.9", "203.0.113.7"),  # forged left part
        ("10.0.0.0/8", "10.0.0.5", "10.1.1.1, 10.2.2.2", "10.1.1.1"),  # every hop trusted: the first
        ("10.0.0.0/8", "10.0.0.5", None, "10.0.0.5"),
        ("10.0.0.0/8", "10.0.0.5", "not-an-address", "not-an-address"),  # what the proxy wrote
        ("2001:db8::/32", "2001:db8::1", "2001:db9::7", "2001:db9::7"),
    ],
)
def test_the_client_a_request_counts_as(trusted, peer, forwarded, client):
    assert _client(trusted, peer, forwarded) == client


def test_nothing_is_checked_when_no_rule_is_set():
    assert Access.of(load_settings({})) is None


def test_a_trusted_proxy_that_is_no_address_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^RANKSTREAM_API_TRUSTED_PROXIES: 'cdn' is not an address or network$"
    ):
        load_settings({"RANKSTREAM_API_TRUSTED_PROXIES": "10.0.0.0/8, cdn"})
