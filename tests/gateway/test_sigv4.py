"""SigV4 verification (vsqs._gateway.sigv4) against requests signed by botocore's own signer."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from email.utils import formatdate
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from vsqs._gateway import sigv4 as _sigv4

KEY, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CREDENTIALS = {KEY: SECRET, "OTHERKEY": "other-secret"}
URL = "http://127.0.0.1:8080/"
BODY = b'{"QueueName":"jobs"}'


def signed(
    *,
    url: str = URL,
    body: bytes = BODY,
    key: str = KEY,
    secret: str = SECRET,
    region: str = "us-east-1",
    service: str = "sqs",
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> dict[str, str]:
    """The request as the gateway sees it, signed by botocore: keyword arguments for verify()."""
    request = AWSRequest(method=method, url=url, data=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue", **(headers or {}),
    })
    SigV4Auth(Credentials(key, secret), service, region).add_auth(request)
    parts = urlsplit(url)
    seen = {name.lower(): value for name, value in request.headers.items()}
    seen["host"] = parts.netloc  # what the HTTP client sends
    raw_path = parts.path or "/"
    return {"method": method, "raw_path": raw_path, "raw_query": parts.query, "headers": seen, "body": body}


def verify(request: dict, *, now: float | None = None, credentials: dict[str, str] = CREDENTIALS) -> str:
    return _sigv4.verify(**request, credentials=credentials, now=time.time() if now is None else now)


def refused(request: dict, **kwargs: object) -> _sigv4.SigV4Error:
    with pytest.raises(_sigv4.SigV4Error) as caught:
        verify(request, **kwargs)  # type: ignore[arg-type]
    return caught.value


def test_a_request_signed_by_botocore_is_accepted() -> None:
    assert verify(signed()) == KEY
    assert verify(signed(key="OTHERKEY", secret="other-secret")) == "OTHERKEY"


def test_any_region_in_the_scope_is_accepted() -> None:
    assert verify(signed(region="eu-west-3")) == KEY


def test_path_and_query_are_canonicalised_as_botocore_does() -> None:
    request = signed(url="http://gw.example:9000/a%20b/./c//d/?b=2&a=x%2Fy&a=1&empty=", method="GET", body=b"")
    assert verify(request) == KEY
    tampered = {**request, "raw_query": "b=3&a=x%2Fy&a=1&empty="}
    assert refused(tampered).code == "SignatureDoesNotMatch"


def test_a_wrong_secret_does_not_match() -> None:
    error = refused(signed(secret="not-the-secret"))
    assert (error.code, error.status) == ("SignatureDoesNotMatch", 403)


def test_an_unknown_access_key_is_refused() -> None:
    error = refused(signed(key="AKIDUNKNOWN"))
    assert (error.code, error.status) == ("InvalidClientTokenId", 403)


def test_no_authorization_header_is_refused() -> None:
    request = signed()
    del request["headers"]["authorization"]
    error = refused(request)
    assert (error.code, error.status) == ("MissingAuthenticationToken", 403)


def test_a_changed_body_does_not_match() -> None:
    request = {**signed(), "body": b'{"QueueName":"other"}'}
    assert refused(request).code == "SignatureDoesNotMatch"


def test_a_changed_signed_header_does_not_match() -> None:
    request = signed()
    request["headers"]["x-amz-target"] = "AmazonSQS.DeleteQueue"
    assert refused(request).code == "SignatureDoesNotMatch"


def test_the_action_header_must_be_signed() -> None:
    request = signed()
    names = request["headers"]["authorization"].split("SignedHeaders=")[1].split(",")[0]
    without = ";".join(name for name in names.split(";") if name != "x-amz-target")
    request["headers"]["authorization"] = request["headers"]["authorization"].replace(names, without)
    error = refused(request)
    assert (error.code, error.status) == ("IncompleteSignature", 400)


def test_an_unsigned_header_may_change() -> None:
    request = signed()
    request["headers"]["user-agent"] = "something else"  # botocore never signs User-Agent
    assert verify(request) == KEY


def test_content_sha256_must_be_that_of_the_body() -> None:
    good = signed(headers={"X-Amz-Content-SHA256": hashlib.sha256(BODY).hexdigest()})
    assert verify(good) == KEY
    lying = signed(headers={"X-Amz-Content-SHA256": hashlib.sha256(b"other").hexdigest()})
    assert refused(lying).code == "SignatureDoesNotMatch"
    unsigned = signed(headers={"X-Amz-Content-SHA256": _sigv4.UNSIGNED_PAYLOAD})
    error = refused(unsigned)
    assert error.code == "SignatureDoesNotMatch" and "unsigned" in error.message


def test_a_request_signed_too_long_ago_or_ahead_has_expired() -> None:
    request = signed()
    assert verify(request, now=time.time() + 14 * 60) == KEY
    assert verify(request, now=time.time() - 14 * 60) == KEY
    for offset in (16 * 60, -16 * 60):
        error = refused(request, now=time.time() + offset)
        assert (error.code, error.status) == ("RequestExpired", 403)


def test_the_date_header_may_stand_in_for_x_amz_date() -> None:
    request = signed(headers={"Date": formatdate(usegmt=True)})  # botocore then signs Date
    assert "x-amz-date" not in request["headers"]
    assert verify(request) == KEY


def test_the_service_must_be_sqs() -> None:
    error = refused(signed(service="s3"))
    assert error.code == "SignatureDoesNotMatch" and "sqs" in error.message
    assert refused(signed(service="sqs-query")).code == "SignatureDoesNotMatch"


def test_the_service_name_localstack_signs_the_query_protocol_with_is_accepted() -> None:
    assert verify(signed(service="sqs_query")) == KEY


def test_the_scope_region_is_read_from_the_header_or_a_presigned_query() -> None:
    request = signed(region="eu-north-1")
    assert _sigv4.scope_region(request["headers"]["authorization"], "") == "eu-north-1"
    assert _sigv4.scope_region(None, presigned()["raw_query"]) == "us-east-1"
    assert _sigv4.scope_region(None, "") is None
    assert _sigv4.scope_region("AWS4-HMAC-SHA256 Credential=AKID/20260101/../x", "") is None  # not five parts
    # (a query without its signature is no presigned request: it names no region)
    assert _sigv4.scope_region(None, "X-Amz-Credential=AKID%2F20260101%2Fap-south-1%2Fsqs%2Faws4_request") is None


def test_a_credential_put_before_the_signed_one_is_refused_and_routes_nowhere() -> None:
    request = signed(region="us-east-1")
    header = request["headers"]["authorization"]
    forged = header.replace("Credential=", "Credential=AKID/20000101/us-west-1/sqs/aws4_request, Credential=", 1)
    request["headers"]["authorization"] = forged
    assert _sigv4.scope_region(forged, "") is None  # routing reads the header as verify does
    assert refused(request).code == "IncompleteSignature"


def test_a_host_rewritten_by_a_proxy_is_accepted_as_signed() -> None:
    request = signed(url="https://queues.example.com/")
    request["headers"]["host"] = "127.0.0.1:8080"  # the proxy's upstream
    assert refused(request).code == "SignatureDoesNotMatch"
    request["headers"]["x-forwarded-host"] = "queues.example.com"
    assert verify(request) == KEY
    del request["headers"]["x-forwarded-host"]
    request["headers"]["forwarded"] = 'for=10.0.0.1;proto=https;host="queues.example.com"'
    assert verify(request) == KEY


@pytest.mark.parametrize("header", [
    "AWS4-HMAC-SHA1 Credential=AKIDEXAMPLE/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, "
    "Signature=" + "0" * 64,
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host",
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/2026/us-east-1/sqs/aws4_request, SignedHeaders=host, "
    "Signature=" + "0" * 64,
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/sqs/aws4_request, SignedHeaders=x-amz-date, "
    "Signature=" + "0" * 64,
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/sqs/aws4_request, SignedHeaders=x-amz-date;host, "
    "Signature=" + "0" * 64,
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=xyz",
    "Bearer abc",
])
def test_a_malformed_authorization_header_is_incomplete(header: str) -> None:
    request = signed()
    request["headers"]["authorization"] = header
    error = refused(request)
    assert (error.code, error.status) == ("IncompleteSignature", 400)


def test_a_signed_request_needs_a_date() -> None:
    request = signed()
    del request["headers"]["x-amz-date"]
    assert refused(request).code == "IncompleteSignature"
    request["headers"]["x-amz-date"] = "yesterday"
    assert refused(request).code == "IncompleteSignature"


def test_the_scope_date_must_be_the_request_date() -> None:
    request = signed()
    auth = request["headers"]["authorization"]
    day = request["headers"]["x-amz-date"][:8]
    request["headers"]["authorization"] = auth.replace(f"/{day}/", "/19990101/")
    error = refused(request)
    assert error.code == "SignatureDoesNotMatch" and "19990101" in error.message


def test_header_map_joins_repeated_headers() -> None:
    headers = _sigv4.header_map([(b"X-A", b"1"), (b"x-a", b"2"), (b"Host", b"h")])
    assert headers == {"x-a": "1,2", "host": "h"}


# -- presigned requests: the signature in the query string (Query-protocol GETs) ----


def presigned(*, expires: int = 300, secret: str = SECRET,
              url: str = URL + "?Action=ListQueues&Version=2012-11-05") -> dict[str, str]:
    """A GET presigned by botocore's query signer (now), as the gateway sees it."""
    from botocore.auth import SigV4QueryAuth

    request = AWSRequest(method="GET", url=url)
    SigV4QueryAuth(Credentials(KEY, secret), "sqs", "us-east-1", expires=expires).add_auth(request)
    parts = urlsplit(request.url)
    return {"method": "GET", "raw_path": parts.path or "/", "raw_query": parts.query,
            "headers": {"host": parts.netloc}, "body": b""}


def signed_at(request: dict[str, str]) -> float:
    """The time a presigned request says it was signed (X-Amz-Date), in epoch seconds:
    the clock the checks below are set against, however long signing took."""
    (amz_date,) = parse_qs(request["raw_query"])["X-Amz-Date"]
    return datetime.strptime(amz_date, _sigv4.AMZ_DATE_FORMAT).replace(tzinfo=UTC).timestamp()


def test_a_presigned_request_is_accepted_until_it_expires() -> None:
    request = presigned(expires=300)
    assert "X-Amz-Signature=" in request["raw_query"]
    at = signed_at(request)
    assert verify(request) == KEY
    assert verify(request, now=at + 300) == KEY
    assert refused(request, now=at + 301).code == "RequestExpired"
    assert verify(request, now=at - _sigv4.MAX_SKEW_SECONDS) == KEY  # signed a little ahead of our clock
    assert refused(request, now=at - _sigv4.MAX_SKEW_SECONDS - 1).code == "RequestExpired"  # far ahead


def test_a_presigned_request_signs_its_query_and_has_no_body() -> None:
    request = presigned()
    assert refused({**request, "raw_query": request["raw_query"].replace("ListQueues", "DeleteQueue")}).code == \
        "SignatureDoesNotMatch"
    assert refused({**request, "body": b"Action=DeleteQueue"}).code == "SignatureDoesNotMatch"
    assert refused(presigned(secret="wrong")).code == "SignatureDoesNotMatch"


@pytest.mark.parametrize("drop", ["X-Amz-Expires", "X-Amz-Credential", "X-Amz-Date"])
def test_a_presigned_request_lacking_a_part_is_incomplete(drop: str) -> None:
    request = presigned()
    query = "&".join(pair for pair in request["raw_query"].split("&") if not pair.startswith(drop + "="))
    assert refused({**request, "raw_query": query}).code == "IncompleteSignature"


def test_a_presigned_request_lives_a_week_at_most() -> None:
    request = presigned()
    query = request["raw_query"].replace("X-Amz-Expires=300", "X-Amz-Expires=604801")
    assert refused({**request, "raw_query": query}).code == "IncompleteSignature"


@pytest.mark.parametrize("make", [signed, presigned], ids=["header", "presigned"])
def test_a_plus_the_form_reads_as_a_space_is_not_what_was_signed(make: object) -> None:
    """The Query form reader takes ``+`` for a space: a query signed with ``%2B``
    (a plus) must not verify when sent with ``+`` (which the gateway would read
    as a space), and a ``+`` sent for a space verifies as ``%20`` signed."""
    url = URL + "?Action=SendMessage&QueueUrl=q&MessageBody=a%2Bb"
    request = signed(url=url, method="GET", body=b"") if make is signed else presigned(url=url)
    assert verify(request) == KEY
    assert "MessageBody=a%2Bb" in request["raw_query"]
    tampered = {**request, "raw_query": request["raw_query"].replace("MessageBody=a%2Bb", "MessageBody=a+b")}
    assert refused(tampered).code == "SignatureDoesNotMatch"
    spaced = signed(url=url.replace("a%2Bb", "a%20b"), method="GET", body=b"") if make is signed else \
        presigned(url=url.replace("a%2Bb", "a%20b"))
    assert verify({**spaced, "raw_query": spaced["raw_query"].replace("MessageBody=a%20b", "MessageBody=a+b")}) == KEY


@pytest.mark.parametrize("expires", ["%C2%B2", "%D9%A3", "-5", "1e3", ""])
def test_a_presigned_expiry_that_is_no_ascii_number_is_incomplete(expires: str) -> None:
    """``²`` passes str.isdigit() but not int(): it must be refused, not fail the request (500)."""
    request = presigned()
    query = request["raw_query"].replace("X-Amz-Expires=300", f"X-Amz-Expires={expires}")
    assert refused({**request, "raw_query": query}).code == "IncompleteSignature"
