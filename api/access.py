"""Who may read the public port, and how much: bearer tokens, what only an admin token may ask
for, the browser origins allowed (CORS) and a per-client rate limit. Every rule is off until its
setting is set (docs/operations/security.md); with none set, `Access.of` gives None and the
front (api/front.py) checks nothing.

The client a rate limit counts is the request's token when it carries a valid one, else its
address: the peer's, or, when the peer is a trusted proxy (a CDN, a load balancer), the first
address of `X-Forwarded-For` from the right that is not one, so that a CDN in front is not
throttled as one client while a client cannot pick its own address by sending the header."""

from __future__ import annotations

import hmac
import ipaddress
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiohttp import web
from cachetools import TTLCache

from api.errors import ApiError
from common.settings import Settings, comma_list

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_CLIENTS = 100_000  # buckets kept; an idle client's bucket is full again, so forgetting it is exact
PREFLIGHT_MAX_AGE_S = 600
ALLOWED_HEADERS = "Authorization, Content-Type, If-None-Match"
EXPOSED_HEADERS = "ETag, Retry-After"


@dataclass(frozen=True)
class AccessRules:
    read_tokens: frozenset[str]
    admin_tokens: frozenset[str]
    lookup_max: int
    origins: frozenset[str]  # "*": any
    rate_per_s: float  # 0: no limit
    burst: int
    trusted: tuple[Network, ...]

    @classmethod
    def of(cls, settings: Settings) -> AccessRules:
        return cls(
            read_tokens=frozenset(comma_list(settings.api_read_tokens.get_secret_value())),
            admin_tokens=frozenset(comma_list(settings.api_admin_tokens.get_secret_value())),
            lookup_max=settings.api_public_lookup_max,
            origins=frozenset(comma_list(settings.api_cors_origins)),
            rate_per_s=settings.api_rate_limit_per_s,
            burst=settings.api_rate_limit_burst,
            trusted=tuple(
                ipaddress.ip_network(n, strict=False) for n in comma_list(settings.api_trusted_proxies)
            ),
        )

    @property
    def any(self) -> bool:
        return bool(self.read_tokens or self.admin_tokens or self.origins or self.rate_per_s)


def _known(token: str, tokens: Iterable[str]) -> bool:
    """Compared in constant time with each (how long a wrong token takes tells nothing)."""
    found = False
    for candidate in tokens:
        found |= hmac.compare_digest(token.encode(), candidate.encode())
    return found


class Access:
    """The rules of one node, and its clients' buckets."""

    def __init__(self, rules: AccessRules, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules, self._clock = rules, clock
        ttl = rules.burst / rules.rate_per_s if rules.rate_per_s else 1.0
        self._buckets: TTLCache[str, tuple[float, float]] = TTLCache(MAX_CLIENTS, ttl=ttl, timer=clock)

    @classmethod
    def of(cls, settings: Settings) -> Access | None:
        rules = AccessRules.of(settings)
        return cls(rules) if rules.any else None

    def admit(self, request: web.Request, *, in_query: bool = False) -> None:
        """A board read may go on, or ApiError: 401 without a valid token where tokens are
        required (or with one that is no token at all), 429 past the client's rate. The token:
        `Authorization: Bearer`, else the page's cookie (TOKEN_COOKIE), else, where `in_query`
        (the pages and the event stream, which a browser opens without headers), `?token=`."""
        rules = self.rules
        token = _bearer(request)
        if token is None and in_query:  # before the cookie: a new token replaces an old one
            token = request.query.get(TOKEN_PARAM)
        if token is None:
            token = request.cookies.get(TOKEN_COOKIE)
        admin = token is not None and _known(token, rules.admin_tokens)
        valid = admin or (token is not None and _known(token, rules.read_tokens))
        if token is not None and not valid:
            raise ApiError(401, "unauthorized", "the bearer token is not valid", _CHALLENGE)
        if rules.read_tokens and not valid:
            raise ApiError(401, "unauthorized", "reads need a bearer token", _CHALLENGE)
        request[ADMIN] = admin
        if rules.rate_per_s:
            self._take(f"token:{token}" if valid else f"addr:{self.client_address(request)}")

    def _take(self, client: str) -> None:
        rules, now = self.rules, self._clock()
        tokens, last = self._buckets.get(client, (float(rules.burst), now))
        tokens = min(float(rules.burst), tokens + (now - last) * rules.rate_per_s)
        if tokens < 1.0:
            wait = math.ceil((1.0 - tokens) / rules.rate_per_s)
            self._buckets[client] = (tokens, now)
            raise ApiError(
                429, "rate_limited", f"too many requests: retry in {wait} s", {"Retry-After": str(wait)}
            )
        self._buckets[client] = (tokens - 1.0, now)

    def client_address(self, request: web.Request) -> str:
        """The peer's address, or the first untrusted hop of X-Forwarded-For from the right when
        the peer is a trusted proxy."""
        peer = request.remote or ""
        if not self.rules.trusted or not self._trusted(peer):
            return peer
        hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",") if h.strip()]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop
        return hops[0] if hops else peer

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False  # not an address (garbage in the header): not a proxy of ours
        return any(ip in network for network in self.rules.trusted)

    def require_admin(self, request: web.Request, what: str) -> None:
        """403 unless the request carries an admin token, once admin tokens are configured."""
        if self.rules.admin_tokens and not request.get(ADMIN, False):
            raise ApiError(403, "forbidden", f"{what} needs an admin token")

    def cors(self, request: web.Request, response: web.StreamResponse) -> None:
        """The CORS headers of an answer to an allowed origin."""
        origin = request.headers.get("Origin")
        if origin is not None and self._allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
            response.headers.add("Vary", "Origin")

    def preflight(self, request: web.Request, methods: set[str]) -> web.Response | None:
        """The answer to a browser's preflight (OPTIONS) from an allowed origin; None otherwise."""
        origin = request.headers.get("Origin")
        if request.method != "OPTIONS" or origin is None or not self._allowed(origin) or not methods:
            return None
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": ", ".join(sorted(methods)),
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
                "Vary": "Origin",
            },
        )

    def _allowed(self, origin: str) -> bool:
        return "*" in self.rules.origins or origin in self.rules.origins

    def needs_token(self) -> bool:
        return bool(self.rules.read_tokens)

    def valid(self, token: str) -> bool:
        return _known(token, self.rules.read_tokens) or _known(token, self.rules.admin_tokens)

    def https(self, request: web.Request) -> bool:
        """Whether the client reached us over HTTPS: the socket's TLS, or a trusted proxy's
        `X-Forwarded-Proto: https` (TLS ended at a load balancer)."""
        if request.secure:
            return True
        forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
        return forwarded == "https" and self._trusted(request.remote or "")


ADMIN: web.RequestKey[bool] = web.RequestKey("rankstream_admin", bool)
# a browser's page holds the read token in this cookie (HttpOnly: its scripts never see it), set
# when the page is opened with ?token= (api/pages.py); an EventSource sends no other header
TOKEN_COOKIE, TOKEN_PARAM = "rankstream_token", "token"
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="rankstream"'}


def _bearer(request: web.Request) -> str | None:
    """The token of `Authorization: Bearer <token>`; None without one ("" for another scheme)."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
