"""TLS to Redis: the one place its settings become what each client needs. redis-py (the worker,
the CLI, a cluster client) takes keyword arguments; the API's own connections (RedisPipe,
ClusterPipe, the change feed) take an ssl.SSLContext. Both verify the server's certificate and
its name against `ca_file` (or the system's trust store) and present a client certificate when
one is set (for servers run with `tls-auth-clients yes`)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cache
from typing import Any

from common.errors import ConfigError


@dataclass(frozen=True)
class RedisTls:
    """RANKSTREAM_REDIS_TLS_*: files, each None when unset. Applies to `rediss://` URLs only."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        """The client context of the API's connections (one per setting, shared); ConfigError
        with one line when a file cannot be read or is not what it should be."""
        return _context(self)

    def redis_kwargs(self) -> dict[str, Any]:
        """redis-py's arguments for the same checks (given with a `rediss://` URL)."""
        self.context()  # the same one-line errors as the API's, before redis-py meets a file
        return {
            "ssl_ca_certs": self.ca_file,
            "ssl_certfile": self.cert_file,
            "ssl_keyfile": self.key_file,
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": True,
        }


NO_TLS = RedisTls()  # rediss:// verified against the system's trust store


@cache
def _context(tls: RedisTls) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"RANKSTREAM_REDIS_TLS_CA_FILE: cannot load {tls.ca_file}: {_reason(exc)}"
        ) from None
    if tls.cert_file is not None:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"RANKSTREAM_REDIS_TLS_CERT_FILE/KEY_FILE: cannot load {tls.cert_file}: {_reason(exc)}"
            ) from None
    return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    return str(exc.strerror or exc)
