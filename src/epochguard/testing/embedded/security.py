"""Listeners and SASL for the EmbeddedCluster: PLAIN and SCRAM-SHA-256/512 (RFC 5802/7677).

Every broker has its PLAINTEXT listener (the one ``bootstrap_servers`` names); a cluster made
with ``sasl_users`` also listens with SASL_PLAINTEXT, and one made with ``tls`` with SSL
(and SASL_SSL when it has both). As on a Kafka broker, a SASL connection may send only
ApiVersions, SaslHandshake and SaslAuthenticate until it has authenticated; anything else
closes it, and so does a failed authentication (after its error response).

SCRAM proofs are checked by ``scramp``; credentials are derived once, at cluster creation,
with Kafka's minimum of 4096 iterations, as ``kafka-storage format --add-scram`` stores them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

PLAINTEXT = "PLAINTEXT"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SSL = "SSL"
SASL_SSL = "SASL_SSL"
LISTENERS = (PLAINTEXT, SASL_PLAINTEXT, SSL, SASL_SSL)

PLAIN = "PLAIN"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
SCRAM_ITERATIONS = 4096

# The messages a Kafka broker sends (SaslServerAuthenticator, PlainServerCallbackHandler).
PLAIN_FAILED = "Authentication failed: Invalid username or password"


def scram_failed(mechanism: str) -> str:
    return (
        "Authentication failed during authentication due to invalid credentials with "
        f"SASL mechanism {mechanism}"
    )


class SaslFailure(Exception):
    """One authentication step failed; the message is what the client is told."""


@attrs.frozen
class SecuritySettings:
    """What a cluster's brokers accept: users (name -> password) and TLS, if any."""

    users: Mapping[str, str] = attrs.field(factory=dict)
    ssl_context: Any = None  # ssl.SSLContext for the SSL/SASL_SSL listeners
    scram_credentials: Mapping[str, Mapping[str, tuple[bytes, bytes, bytes, int]]] = attrs.field(
        factory=dict
    )

    @classmethod
    def create(cls, users: Mapping[str, str] | None, ssl_context: Any) -> SecuritySettings:
        users = dict(users or {})
        if users:
            # A dev dependency, needed only by a cluster with SASL users.
            from scramp import ScramMechanism
        else:
            return cls({}, ssl_context, {})
        for name, password in users.items():
            if not isinstance(name, str) or not name or "," in name or "=" in name:
                raise ValueError(f"SASL user {name!r}: names must be non-empty, without , or =")
            if not isinstance(password, str) or not password:
                raise ValueError(f"SASL user {name!r}: the password must be a non-empty str")
        credentials = {
            mechanism: {
                name: ScramMechanism(mechanism).make_auth_info(
                    password, iteration_count=SCRAM_ITERATIONS
                )
                for name, password in users.items()
            }
            for mechanism in SCRAM_MECHANISMS
        }
        return cls(users, ssl_context, credentials)

    @property
    def listeners(self) -> tuple[str, ...]:
        extra = []
        if self.users:
            extra.append(SASL_PLAINTEXT)
        if self.ssl_context is not None:
            extra.append(SSL)
            if self.users:
                extra.append(SASL_SSL)
        return tuple(extra)


@attrs.define(eq=False)
class Connection:
    """Per-connection state: the listener it came in on and how far SASL has got."""

    listener: str = PLAINTEXT
    mechanism: str | None = None
    principal: str | None = None
    close_after_response: bool = False
    _step: Callable[[bytes], bytes] | None = None

    @property
    def needs_sasl(self) -> bool:
        return self.listener in (SASL_PLAINTEXT, SASL_SSL)

    @property
    def authenticated(self) -> bool:
        return not self.needs_sasl or self.principal is not None

    def start(self, mechanism: str, settings: SecuritySettings) -> None:
        self.mechanism = mechanism
        if mechanism == PLAIN:
            self._step = lambda token: self._plain(token, settings)
        else:
            self._step = _ScramExchange(self, mechanism, settings).step

    def authenticate(self, token: bytes) -> bytes:
        """One SaslAuthenticate round: the server's answer, or :class:`SaslFailure`."""
        if self._step is None:
            raise SaslFailure("SaslAuthenticate before a successful SaslHandshake")
        return self._step(token)

    def _plain(self, token: bytes, settings: SecuritySettings) -> bytes:
        # RFC 4616: [authzid] NUL authcid NUL passwd
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("Invalid SASL/PLAIN response: expected 3 tokens")
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        if authzid and authzid != user:
            raise SaslFailure("Authentication failed: Client requested an authorization id")
        if not user or settings.users.get(user) != password:
            raise SaslFailure(PLAIN_FAILED)
        self.principal = user
        self._step = None
        return b""


class _ScramExchange:
    """The server side of one SCRAM exchange: client-first, then client-final."""

    def __init__(self, conn: Connection, mechanism: str, settings: SecuritySettings) -> None:
        from scramp import ScramMechanism

        self._conn = conn
        self._mechanism = mechanism
        self._credentials = settings.scram_credentials[mechanism]
        self._user: str | None = None
        self._server = ScramMechanism(mechanism).make_server(self._lookup)
        self._round = 0

    def _lookup(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        credential = self._credentials.get(user)
        if credential is None:
            raise SaslFailure(scram_failed(self._mechanism))
        self._user = user
        return credential

    def step(self, token: bytes) -> bytes:
        from scramp import ScramException

        self._round += 1
        try:
            message = token.decode("utf-8")
            if self._round == 1:
                self._server.set_client_first(message)
                return str(self._server.get_server_first()).encode()
            if self._round == 2:
                self._server.set_client_final(message)
                final = str(self._server.get_server_final()).encode()
                self._conn.principal = self._user
                return final
        except (ScramException, UnicodeDecodeError) as e:
            raise SaslFailure(scram_failed(self._mechanism)) from e
        raise SaslFailure("SCRAM exchange already complete")
