"""The configuration of a gateway process: plain data, so it travels as JSON
to the workers of ``vsqs serve --workers N``, in a file only the owner can
read (never in their environment, which ``/proc`` shows)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass, field

from vsqs._gateway.limits import (
    BODY_TIMEOUT,
    CONSOLE_INTERVAL,
    GC_INTERVAL,
    HEADER_TIMEOUT,
    SQS_MAX_MESSAGE_BYTES,
)

CONFIG_FILE_ENV = "VSQS_GATEWAY_CONFIG_FILE"  # `vsqs serve --workers N`: the path of the config file of each worker
SECRET_ENVS = ("VSQS_API_KEY", "VSQS_AWS_SECRET_ACCESS_KEY")  # read at start, kept out of the workers' environment
DEFAULT_MAX_BODY_BYTES = SQS_MAX_MESSAGE_BYTES
_CAP_MESSAGES = 10  # the native request cap holds this many full-size bodies (a batch of small ones may hold 100)
_CONFIG_FILE = "config.json"
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


@dataclass(frozen=True)
class GatewayConfig:
    """Everything a gateway process needs; plain data, so it travels as JSON to workers."""

    spool: str
    api_key: str | None = None
    aws_credentials: dict[str, str] = field(default_factory=dict)  # access key id -> secret
    region: str = "us-east-1"  # the home region: the spool's (SPOOL)
    region_spools: dict[str, str] = field(default_factory=dict)  # --region-spool: region -> its spool's directory
    account_id: str = "000000000000"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # --max-body-bytes: the largest message (an SQS batch: all of it)
    file_mode: str | None = None  # given to the queues the gateway creates (e.g. "0660")
    listen_host: str = "127.0.0.1"  # --host: the address the server was started for
    public_hosts: list[str] = field(default_factory=list)  # --public-host: more names clients may use (a proxy's)
    public_url: str | None = None  # --public-url: the base of queue URLs (else the request's scheme and Host)
    header_timeout: float = HEADER_TIMEOUT  # seconds to send a request's head (vsqs._gateway.timeouts)
    body_timeout: float = BODY_TIMEOUT  # seconds, after the head, to send the whole body
    gc_interval: float = GC_INTERVAL  # seconds between housekeeping sweeps of the spool (0: none)
    console_interval: float = CONSOLE_INTERVAL  # seconds between the console's samples of the spool (0: none)
    sqs_recently_deleted: float = 0.0  # seconds the SQS face refuses CreateQueue of a deleted name (0: never)
    sqs_purge_interval: float = 0.0  # seconds the SQS face refuses a queue's next PurgeQueue (0: never)
    console_secret: str | None = None  # signs the console's sessions; drawn at each start, shared by the workers

    @property
    def max_request_bytes(self) -> int:
        """The native API's cap: _CAP_MESSAGES full-size bodies in base64, plus the JSON around them."""
        return (_CAP_MESSAGES * self.max_body_bytes * 4) // 3 + 256 * 1024

    @property
    def max_sqs_request_bytes(self) -> int:
        """The SQS face's cap: SQS takes at most one message's worth per request (a batch
        included); JSON escapes may triple non-ASCII text."""
        return 3 * self.max_body_bytes + 64 * 1024

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> GatewayConfig:
        return cls(**json.loads(text))

    def write_private(self, directory: str) -> str:
        """Write this config (secrets included) to a new file in ``directory``
        that only the owner can read (mode 0600 from its creation); its path."""
        path = os.path.join(directory, _CONFIG_FILE)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        return path

    @classmethod
    def from_file(cls, path: str) -> GatewayConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())


def host_name(authority: str) -> str | None:
    """The name in ``host[:port]`` (a Host header, an Origin's authority):
    lowercase, without brackets, port or a trailing dot; ``None`` if malformed."""
    text = authority.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        name, rest = (text[1:end], text[end + 1:]) if end > 0 else ("", "")
    else:
        name, colon, port = text.partition(":")
        rest = colon + port
    if not name or (rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6)):
        return None
    return name[:-1] if name.endswith(".") and len(name) > 1 else name


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_host_name(name: str) -> str:
    """A name for ``--public-host``: a DNS name or an IP address, normalised; ValueError if not."""
    found = host_name(name if ":" not in name or name.startswith("[") else f"[{name}]")
    if found is None or not (is_ip_literal(found) or (len(found) <= 253 and _HOST_NAME.fullmatch(found))):
        raise ValueError(f"{name!r} is not a host name or an IP address")
    return found
