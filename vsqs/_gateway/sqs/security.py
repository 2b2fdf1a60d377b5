"""The queue attributes vsqs keeps for SQS clients but does not obey: Policy
(an access policy: stored, returned, edited by AddPermission and
RemovePermission, never enforced: the gateway's keys and the spool's file
permissions decide who may do what) and the encryption attributes
KmsMasterKeyId, KmsDataKeyReusePeriodSeconds, SqsManagedSseEnabled (stored
and reported; vsqs calls no KMS: the bodies are as safe as the spool's
filesystem keeps them). Each is a queue setting, so every gateway and
process sees it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vsqs import InvalidArgument
from vsqs._core import settings as _settings
from vsqs._gateway.sqs.protocol import SqsError, invalid_attribute_value

# attribute -> setting
SECURITY_ATTRIBUTES: dict[str, str] = {
    "Policy": "policy",
    "KmsMasterKeyId": "kms_master_key_id",
    "KmsDataKeyReusePeriodSeconds": "kms_data_key_reuse_period",
    "SqsManagedSseEnabled": "sqs_managed_sse",
}
DEFAULT_KMS_REUSE_PERIOD = 300  # Amazon's default, reported for a queue with a KMS key


def security_settings(attributes: Mapping[str, str]) -> dict[str, Any]:
    """The settings for the security attributes among ``attributes`` ("" unsets one)."""
    changes: dict[str, Any] = {}
    for name, setting in SECURITY_ATTRIBUTES.items():
        if name not in attributes:
            continue
        text = attributes[name]  # "" unsets
        if name == "SqsManagedSseEnabled" and text.lower() not in ("true", "false", ""):
            raise invalid_attribute_value(name)
        if name == "KmsDataKeyReusePeriodSeconds" and text and not text.isdigit():
            raise invalid_attribute_value(name)
        try:
            changes.update(_settings.validate({setting: text if text else None}))
        except InvalidArgument:
            raise invalid_attribute_value(name) from None
    if changes.get("kms_master_key_id") and changes.get("sqs_managed_sse"):
        raise SqsError("InvalidAttributeName", "You can use one type of server-side encryption (SSE) at one time. "
                       "You can either enable KMS SSE or SQS SSE.")
    if changes.get("kms_master_key_id"):
        changes["sqs_managed_sse"] = False  # SSE-KMS replaces SSE-SQS
    elif changes.get("sqs_managed_sse"):
        changes["kms_master_key_id"] = None
    return changes


def security_attributes(settings: Mapping[str, Any], want: Callable[[str], bool]) -> dict[str, str]:
    """The security attributes asked for: Policy when set; the KMS key and its
    reuse period when a key is set; SqsManagedSseEnabled (Amazon's default: true)."""
    out: dict[str, str] = {}
    if want("Policy") and settings["policy"]:
        out["Policy"] = settings["policy"]
    kms = settings["kms_master_key_id"]
    if kms:
        if want("KmsMasterKeyId"):
            out["KmsMasterKeyId"] = kms
        if want("KmsDataKeyReusePeriodSeconds"):
            out["KmsDataKeyReusePeriodSeconds"] = str(settings["kms_data_key_reuse_period"] or DEFAULT_KMS_REUSE_PERIOD)
    if want("SqsManagedSseEnabled"):
        out["SqsManagedSseEnabled"] = "false" if kms or settings["sqs_managed_sse"] is False else "true"
    return out
