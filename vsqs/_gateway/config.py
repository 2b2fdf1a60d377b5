"""The configuration of a gateway process: plain data, so it travels as JSON
to the workers of ``vsqs serve --workers N``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vsqs._gateway.limits import BODY_TIMEOUT, HEADER_TIMEOUT, SQS_MAX_MESSAGE_BYTES

CONFIG_ENV = "VSQS_GATEWAY_CONFIG"  # how `vsqs serve --workers N` hands its config to each worker
DEFAULT_MAX_MESSAGE_BYTES = SQS_MAX_MESSAGE_BYTES
_CAP_MESSAGES = 10  # the native request cap holds this many full-size bodies (a batch of small ones may hold 100)


@dataclass(frozen=True)
class GatewayConfig:
    """Everything a gateway process needs; plain data, so it travels as JSON to workers."""

    spool: str
    api_key: str | None = None
    aws_credentials: dict[str, str] = field(default_factory=dict)  # access key id -> secret
    region: str = "us-east-1"
    account_id: str = "000000000000"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    file_mode: str | None = None  # given to the queues the gateway creates (e.g. "0660")
    header_timeout: float = HEADER_TIMEOUT  # seconds to send a request's head (vsqs._gateway.timeouts)
    body_timeout: float = BODY_TIMEOUT  # seconds, after the head, to send the whole body

    @property
    def max_request_bytes(self) -> int:
        """The native API's cap: _CAP_MESSAGES full-size bodies in base64, plus the JSON around them."""
        return (_CAP_MESSAGES * self.max_message_bytes * 4) // 3 + 256 * 1024

    @property
    def max_sqs_request_bytes(self) -> int:
        """The SQS face's cap: SQS takes at most one message's worth per request (a batch
        included); JSON escapes may triple non-ASCII text."""
        return 3 * self.max_message_bytes + 64 * 1024

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> GatewayConfig:
        return cls(**json.loads(text))
