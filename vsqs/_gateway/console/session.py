"""Who may use the console: signed session cookies and CSRF tokens.

Every visitor holds a session cookie, ``vsqs_console``:
``KIND.EXPIRES.NONCE.SIGNATURE``, signed with HMAC-SHA256 by a secret of
the gateway (derived from the API key and a secret drawn at ``vsqs serve``
start and shared by its workers, so a restart or a new key signs everyone
out). KIND is ``k`` once the visitor gave the API key on the sign-in page,
``a`` (anonymous) before; with no API key configured an anonymous session
may act, as the API lets anyone on loopback act. The cookie is
``HttpOnly``, ``SameSite=Strict``, limited to ``/ui``, expires, and is
``Secure`` over HTTPS. Every action is a POST carrying a CSRF token, an
HMAC of the session's nonce: a page of another origin can neither read
it nor (SameSite, and the Origin checks of
:class:`~vsqs._gateway.auth.BrowserGuard`) send the cookie with a request.
Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

COOKIE = "vsqs_console"
COOKIE_PATH = "/ui"
SESSION_SECONDS = 12 * 3600  # a signed-in session lasts this long, then the key is asked again
ANONYMOUS, SIGNED_IN = "a", "k"
_MAX_COOKIE = 256


@dataclass(frozen=True)
class Session:
    kind: str  # ANONYMOUS or SIGNED_IN
    expires: int  # epoch seconds
    nonce: str

    @property
    def signed_in(self) -> bool:
        return self.kind == SIGNED_IN


class Sessions:
    """Makes and checks session cookies and CSRF tokens for one gateway."""

    def __init__(self, api_key: str | None, secret: str | None) -> None:
        self.needs_key = api_key is not None
        self._api_key = api_key.encode() if api_key is not None else None
        drawn = secret if secret else secrets.token_hex(32)  # no shared secret: this process's own
        self._secret = hashlib.sha256(b"vsqs console\0" + (self._api_key or b"") + b"\0" + drawn.encode()).digest()

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def new(self, signed_in: bool, now: float | None = None) -> tuple[Session, str]:
        """A fresh session (a new nonce: signing in never keeps the old one) and its cookie value."""
        session = Session(SIGNED_IN if signed_in else ANONYMOUS, int((now or time.time()) + SESSION_SECONDS),
                          secrets.token_hex(16))
        text = f"{session.kind}.{session.expires}.{session.nonce}"
        return session, f"{text}.{self._sign(text)}"

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session of a cookie value; None if absent, malformed, forged or expired."""
        if not cookie or len(cookie) > _MAX_COOKIE:
            return None
        parts = cookie.split(".")
        if len(parts) != 4 or parts[0] not in (ANONYMOUS, SIGNED_IN) or not parts[1].isdigit():
            return None
        text, signature = ".".join(parts[:3]), parts[3]
        if not hmac.compare_digest(signature.encode(), self._sign(text).encode()):
            return None
        session = Session(parts[0], int(parts[1]), parts[2])
        if session.expires <= (time.time() if now is None else now):
            return None
        return session

    def may_act(self, session: Session | None) -> bool:
        """Whether this session may see the console and act: signed in, or any with no API key."""
        return session is not None and (session.signed_in or not self.needs_key)

    def key_matches(self, given: str) -> bool:
        """Whether ``given`` is the API key (constant time)."""
        return self._api_key is not None and hmac.compare_digest(given.encode(), self._api_key)

    def csrf_token(self, session: Session) -> str:
        return self._sign(f"csrf.{session.nonce}")

    def csrf_ok(self, session: Session | None, token: str | None) -> bool:
        return (session is not None and token is not None
                and hmac.compare_digest(token.encode(), self.csrf_token(session).encode()))
