"""AWS Signature Version 4 verification for the SQS face of the gateway (pure: no I/O).

The gateway holds the secret of every access key it accepts, rebuilds the
signature a client computed from the same request, and compares the two.
What is checked, in order (each failure names the AWS error code a client
expects):

1. an ``Authorization: AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/SERVICE/aws4_request,
   SignedHeaders=..., Signature=...`` header (none: ``MissingAuthenticationToken``;
   unparseable, another algorithm, ``host`` not signed, no date:
   ``IncompleteSignature``);
2. the access key is configured (``InvalidClientTokenId``);
3. the request time (``X-Amz-Date``, else ``Date``) is within 15 minutes of
   ours (``RequestExpired``) and is the day of the credential scope;
4. the body is the one that was signed: ``X-Amz-Content-SHA256``, if sent,
   must be the SHA-256 of the body (``UNSIGNED-PAYLOAD`` is refused: SQS
   clients always sign the payload);
5. the signature matches (``SignatureDoesNotMatch``), compared in constant time.

``X-Amz-Target`` (the action) must be among the signed headers when present
(``IncompleteSignature``): otherwise a captured request could be replayed as
another action on the same body.

The region in the scope is not checked against the gateway's (clients sign
with whatever region they are configured for; the signing key depends on
it, so the signature still proves the secret); the service must be ``sqs``
(or ``sqs_query``, the name LocalStack's tests sign SQS's Query protocol with:
:data:`SERVICES`).
A gateway with spools for several regions serves a request from its scope's
region's spool when its queue URL names none (:func:`scope_region`;
docs/gateway.md, Regions).
A request that went through a reverse proxy may arrive with another ``Host``
than the client signed: when the signature does not match with ``Host``, it
is tried with the first host named by ``X-Forwarded-Host`` and the first
named by ``Forwarded: host=`` (the host the client addressed, as the proxy
nearest it wrote it).

A request without an ``Authorization`` header may carry its signature in the
query string instead (a presigned URL: ``X-Amz-Algorithm``,
``X-Amz-Credential``, ``X-Amz-Date``, ``X-Amz-Expires``,
``X-Amz-SignedHeaders``, ``X-Amz-Signature``; SQS's Query protocol allows a
GET signed so). It is checked the same way, its time against
``X-Amz-Expires`` (at most 7 days; ``RequestExpired`` after), the query
string but the signature itself signed, and it must have no body (a body
it carried would be unsigned): its payload is the empty one, hashed, or
``UNSIGNED-PAYLOAD``.

Cost. The gateway verifies before it knows who is asking, so verification
costs the same small, bounded work whatever the request holds: the
canonical request (path, query, signed headers) is built once, the signing
key derived once, and at most :data:`MAX_CANDIDATE_HOSTS` signatures are
computed, one per candidate host, each a SHA-256 and an HMAC of a string
as long as the request head (which the HTTP server bounds). The caller runs
:func:`verify` on a worker thread: it hashes the body.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote, unquote_plus

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
# "sqs_query": the service name LocalStack's signing test client gives SQS's Query protocol
# (its AWS-validated test_endpoint_strategy_with_multi_region signs presigned GETs so, and
# Amazon answered them); no AWS service signs with it, so no other service's signature is taken
SERVICES = frozenset({SERVICE, "sqs_query"})
MAX_SKEW_SECONDS = 15 * 60
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_CANDIDATE_HOSTS = 3  # Host, the first X-Forwarded-Host, the first Forwarded host=
MAX_PRESIGNED_EXPIRES = 7 * 24 * 3600  # X-Amz-Expires: a presigned URL lives a week at most
_EMPTY_PAYLOAD_HASH = hashlib.sha256(b"").hexdigest()

_CREDENTIAL_RE = re.compile(r"([^/]+)/([0-9]{8})/([^/]+)/([^/]+)/aws4_request")
_SIGNATURE_RE = re.compile(r"[0-9a-f]{64}")
_EXPIRES_RE = re.compile(r"[0-9]{1,7}")  # ASCII digits: str.isdigit() takes "²", which int() refuses
_HEADER_NAME_RE = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")


class SigV4Error(Exception):
    """A refused request: ``code`` is the AWS error code, ``status`` the HTTP status."""

    def __init__(self, code: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


@dataclass(frozen=True)
class Authorization:
    """The parts of an ``Authorization: AWS4-HMAC-SHA256 ...`` header."""

    access_key: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def _incomplete(message: str) -> SigV4Error:
    return SigV4Error("IncompleteSignature", message, 400)


def parse_authorization(header: str) -> Authorization:
    """Split an ``Authorization`` header; ``IncompleteSignature`` if it is not a SigV4 one."""
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _incomplete(f"unsupported authorization algorithm {algorithm[:40]!r}: use {ALGORITHM}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            if key.strip() in fields:  # (one reading only: the header itself is not signed)
                raise _incomplete(f"the Authorization header names {key.strip()[:40]!r} twice")
            fields[key.strip()] = value.strip()
    missing = [key for key in ("Credential", "SignedHeaders", "Signature") if not fields.get(key)]
    if missing:
        raise _incomplete(f"the Authorization header lacks {', '.join(missing)}")
    credential = _CREDENTIAL_RE.fullmatch(fields["Credential"])
    if credential is None:
        raise _incomplete("Credential must be ACCESS_KEY/YYYYMMDD/REGION/SERVICE/aws4_request")
    signed = tuple(fields["SignedHeaders"].split(";"))
    if not all(_HEADER_NAME_RE.fullmatch(name) for name in signed) or list(signed) != sorted(set(signed)):
        raise _incomplete("SignedHeaders must be lower-case header names, sorted, separated by ';'")
    if "host" not in signed:
        raise _incomplete("the host header must be signed")
    if not _SIGNATURE_RE.fullmatch(fields["Signature"]):
        raise _incomplete("Signature must be 64 lower-case hex digits")
    access_key, date, region, service = credential.groups()
    return Authorization(access_key, date, region, service, signed, fields["Signature"])


def request_time(headers: Mapping[str, str]) -> tuple[datetime, str]:
    """(the signed request time, as SigV4 writes it) from ``X-Amz-Date`` or ``Date``."""
    amz_date = headers.get("x-amz-date")
    try:
        if amz_date is not None:
            when = datetime.strptime(amz_date.strip(), AMZ_DATE_FORMAT).replace(tzinfo=UTC)
        elif headers.get("date") is not None:
            when = parsedate_to_datetime(headers["date"]).astimezone(UTC)
        else:
            raise _incomplete("a signed request needs an X-Amz-Date or Date header")
    except (ValueError, TypeError):
        raise _incomplete("X-Amz-Date must be YYYYMMDDTHHMMSSZ (or Date an HTTP date)") from None
    return when, when.strftime(AMZ_DATE_FORMAT)


def canonical_uri(raw_path: str) -> str:
    """The path as SigV4 wants it for every service but S3: dot segments and
    empty segments removed, then URI-encoded (so a %-escape is encoded again)."""
    segments: list[str] = []
    for segment in raw_path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment and segment != ".":
            segments.append(segment)
    path = "/" + "/".join(segments)
    if raw_path.endswith("/") and segments:
        path += "/"
    return quote(path, safe="/~")


def canonical_query(raw_query: str) -> str:
    """Each name and value decoded then URI-encoded the SigV4 way, sorted. A ``+``
    is decoded as a space, as the Query protocol's form reader
    (:func:`vsqs._gateway.sqs.query.split_form`) reads it: the signature must
    cover what the gateway acts on, or ``%2B`` (signed) could be sent as ``+``
    (read as a space) under the same signature."""
    pairs = []
    for pair in raw_query.split("&") if raw_query else ():
        name, _, value = pair.partition("=")
        pairs.append((quote(unquote_plus(name), safe="-_.~"), quote(unquote_plus(value), safe="-_.~")))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


@dataclass(frozen=True)
class Presigned:
    """The signature a presigned URL carries in its query string."""

    auth: Authorization
    amz_date: str
    expires: int
    raw_query: str  # the query string without X-Amz-Signature: what was signed


def has_presigned_signature(raw_query: str) -> bool:
    """Whether a query string carries ``X-Amz-Signature``, its names decoded as
    :func:`parse_presigned` decodes them (``X-Amz-Signatur%65`` is one too)."""
    return any(unquote(pair.partition("=")[0]) == "X-Amz-Signature"
               for pair in raw_query.split("&")) if raw_query else False


def parse_presigned(raw_query: str) -> Presigned | None:
    """The signature in a query string (None: it has no ``X-Amz-Signature``);
    ``IncompleteSignature`` if it is not a whole SigV4 one."""
    fields: dict[str, str] = {}
    kept: list[str] = []
    for pair in raw_query.split("&") if raw_query else ():
        name, _, value = pair.partition("=")
        name = unquote(name)
        if name.startswith("X-Amz-"):
            fields[name] = unquote(value)
        if name != "X-Amz-Signature":
            kept.append(pair)
    if "X-Amz-Signature" not in fields:
        return None
    missing = [name for name in ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                                 "X-Amz-SignedHeaders") if not fields.get(name)]
    if missing:
        raise _incomplete(f"a presigned request lacks {', '.join(missing)}")
    header = (f"{fields['X-Amz-Algorithm']} Credential={fields['X-Amz-Credential']}, "
              f"SignedHeaders={fields['X-Amz-SignedHeaders']}, Signature={fields['X-Amz-Signature']}")
    expires = fields["X-Amz-Expires"]
    if not _EXPIRES_RE.fullmatch(expires) or not 1 <= int(expires) <= MAX_PRESIGNED_EXPIRES:
        raise _incomplete(f"X-Amz-Expires must be a number of seconds 1..{MAX_PRESIGNED_EXPIRES}")
    _, amz_date = request_time({"x-amz-date": fields["X-Amz-Date"]})
    return Presigned(parse_authorization(header), amz_date, int(expires), "&".join(kept))


def scope_region(authorization: str | None, raw_query: str) -> str | None:
    """The region of a request's credential scope, as sent: from the ``Authorization``
    header, else from a presigned query's ``X-Amz-Credential``; None if there is none.
    Neither checked nor verified here (the caller checks the name, :func:`verify` the
    signature); never raises, and costs one pass over the header or the query."""
    try:  # (read as verify reads it: the region routed to is the one the signature was checked with)
        if authorization is not None:
            return parse_authorization(authorization).region
        presigned = parse_presigned(raw_query) if raw_query else None
    except SigV4Error:
        return None
    return presigned.auth.region if presigned is not None else None


@dataclass(frozen=True)
class CanonicalRequest:
    """A canonical request built once, but for the value of its ``host`` line,
    so that trying another host costs a string concatenation, not a rebuild."""

    head: str  # up to and including "host:"
    tail: str  # from the end of the host line

    def with_host(self, host: str) -> str:
        return f"{self.head}{' '.join(host.split())}{self.tail}"


def canonical_parts(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    signed_headers: Sequence[str],
    payload_hash: str,
) -> CanonicalRequest:
    """The canonical request with its host left open; ``headers`` maps lower-case
    names to values (repeated headers already joined with commas); each value
    is trimmed, inner runs of spaces collapsed. ``host`` must be signed."""
    lines = [f"{name}:{' '.join(headers.get(name, '').split())}" for name in signed_headers]
    at = list(signed_headers).index("host")
    head = "\n".join([method.upper(), canonical_uri(raw_path), canonical_query(raw_query), *lines[:at], "host:"])
    tail = "\n".join(["", *lines[at + 1:], "", ";".join(signed_headers), payload_hash])
    return CanonicalRequest(head, tail)


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode("utf-8")
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return key


def signature(key: bytes, auth: Authorization, amz_date: str, canonical: str) -> str:
    """The signature of a canonical request with a key from :func:`signing_key`."""
    return hmac.new(key, string_to_sign(amz_date, auth.scope, canonical).encode("utf-8"),
                    hashlib.sha256).hexdigest()


def header_map(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as lower-case name -> value, repeated headers joined with commas."""
    joined: dict[str, list[str]] = {}
    for name, value in headers:
        joined.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return {name: ",".join(values) for name, values in joined.items()}


_FORWARDED_HOST_RE = re.compile(r'(?:^|[;,])[ \t]*host[ \t]*=[ \t]*("[^"]*"|[^;,]*)', re.IGNORECASE)


def candidate_hosts(headers: Mapping[str, str]) -> list[str]:
    """The hosts the client may have signed, at most :data:`MAX_CANDIDATE_HOSTS`:
    ``Host``, then the first host of ``X-Forwarded-Host`` and the first
    ``host=`` of ``Forwarded`` (a proxy that appends puts the host the client
    addressed first). However many a request names, no more are tried."""
    host = headers.get("host", "")
    candidates = [host]
    forwarded = _FORWARDED_HOST_RE.search(headers.get("forwarded", ""))
    for named in (headers.get("x-forwarded-host", "").split(",", 1)[0].strip(),
                  forwarded.group(1).strip().strip('"') if forwarded else ""):
        if named and named not in candidates:
            candidates.append(named)
    return candidates[:MAX_CANDIDATE_HOSTS]


def verify(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    body: bytes,
    credentials: Mapping[str, str],
    now: float,
) -> str:
    """Check a request's SigV4 signature against ``credentials`` (access key id ->
    secret); return the access key id, or raise :class:`SigV4Error`.

    ``headers`` are lower-case name -> value (see :func:`header_map`); ``now``
    is epoch seconds.
    """
    header = headers.get("authorization")
    presigned = parse_presigned(raw_query) if header is None else None
    if header is None and presigned is None:
        raise SigV4Error("MissingAuthenticationToken",
                         "the request must be signed (AWS Signature Version 4): no Authorization header")
    if presigned is not None:
        auth, amz_date = presigned.auth, presigned.amz_date
    else:
        assert header is not None
        auth = parse_authorization(header)
        amz_date = request_time(headers)[1]
    if "x-amz-target" in headers and "x-amz-target" not in auth.signed_headers:
        # the action is in this header: unsigned, a captured SendMessage could be replayed as DeleteQueue
        raise SigV4Error("IncompleteSignature", "X-Amz-Target must be among the signed headers", 400)
    secret = credentials.get(auth.access_key)
    if secret is None:
        raise SigV4Error("InvalidClientTokenId",
                         f"the access key id {auth.access_key[:40]!r} is not one this gateway accepts")
    _check_time(amz_date, now, presigned.expires if presigned is not None else None)
    if amz_date[:8] != auth.date:
        raise SigV4Error("SignatureDoesNotMatch",
                         f"the credential scope's date {auth.date} is not the request's date {amz_date[:8]}")
    if auth.service not in SERVICES:
        raise SigV4Error("SignatureDoesNotMatch",
                         f"the credential must be scoped to service {' or '.join(map(repr, sorted(SERVICES)))}, "
                         f"not {auth.service[:40]!r}")
    if presigned is not None:
        if body:
            raise SigV4Error("SignatureDoesNotMatch", "a request signed in its query string carries no body")
        return _check_signature(auth, secret, amz_date, headers,
                                canonical_parts(method, raw_path, presigned.raw_query, headers, auth.signed_headers,
                                                _EMPTY_PAYLOAD_HASH),
                                canonical_parts(method, raw_path, presigned.raw_query, headers, auth.signed_headers,
                                                UNSIGNED_PAYLOAD))
    payload_hash = hashlib.sha256(body).hexdigest()
    claimed = headers.get("x-amz-content-sha256")
    if claimed is not None and claimed.strip().lower() != payload_hash:
        raise SigV4Error("SignatureDoesNotMatch",
                         "X-Amz-Content-SHA256 is not the SHA-256 of the body"
                         + (" (unsigned payloads are not accepted)" if claimed.strip() == UNSIGNED_PAYLOAD else ""))
    return _check_signature(auth, secret, amz_date, headers,
                            canonical_parts(method, raw_path, raw_query, headers, auth.signed_headers, payload_hash))


def _check_time(amz_date: str, now: float, expires: int | None) -> None:
    """A signed request is good within MAX_SKEW_SECONDS of its date; a presigned one
    (``expires`` seconds) from its date (give or take the skew) until it expires."""
    skew = datetime.strptime(amz_date, AMZ_DATE_FORMAT).replace(tzinfo=UTC).timestamp() - now
    if expires is not None and -expires <= skew <= MAX_SKEW_SECONDS:
        return
    if expires is not None and skew < 0:
        raise SigV4Error("RequestExpired", f"the presigned request (signed at {amz_date}) expired "
                         f"{-skew - expires:.0f} s ago")
    if abs(skew) > MAX_SKEW_SECONDS:
        raise SigV4Error("RequestExpired",
                         f"the request was signed at {amz_date}, {abs(skew):.0f} s from the gateway's "
                         f"clock (at most {MAX_SKEW_SECONDS} s allowed): check the clocks")


def _check_signature(auth: Authorization, secret: str, amz_date: str, headers: Mapping[str, str],
                     *candidates: CanonicalRequest) -> str:
    """The access key id if the signature is that of one of the canonical requests
    with one of the candidate hosts (at most two requests, so six signatures)."""
    key = signing_key(secret, auth.date, auth.region, auth.service)
    for parts in candidates:
        for host in candidate_hosts(headers):
            if hmac.compare_digest(signature(key, auth, amz_date, parts.with_host(host)), auth.signature):
                return auth.access_key
    raise SigV4Error("SignatureDoesNotMatch",
                     "the request signature does not match: check the secret access key and the signing method")
