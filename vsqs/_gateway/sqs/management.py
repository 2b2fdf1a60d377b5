"""The SQS actions that manage a queue rather than its messages: tags,
permissions (the Policy attribute), dead-letter sources and message move
tasks (redrive). Everything is kept in the queue's directory (its settings,
its redrive tasks' state files), so every gateway process sees it."""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any

from vsqs import InvalidArgument, Queue, QueueNotFound
from vsqs._core.rules import check_queue_name, load_json
from vsqs._core.settings import MAX_TAG_KEY, MAX_TAG_VALUE, MAX_TAGS
from vsqs._gateway.errors import without_paths
from vsqs._gateway.limits import MAX_LIST_RESULTS
from vsqs._gateway.sqs.call import Call
from vsqs._gateway.sqs.parameters import integer, required_string, string, string_list, string_map
from vsqs._gateway.sqs.protocol import SqsError, invalid_parameter_value, missing
from vsqs._gateway.state import Gateway

MAX_MOVE_TASKS = 10  # ListMessageMoveTasks' MaxResults
MAX_MOVE_RATE = 500  # MaxNumberOfMessagesPerSecond
PERMISSION_ACTIONS = frozenset({"*", "ChangeMessageVisibility", "DeleteMessage", "GetQueueAttributes",
                                "GetQueueUrl", "ReceiveMessage", "SendMessage"})
_LABEL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _invalid(parameter: str, value: str, reason: str) -> SqsError:
    return invalid_parameter_value(parameter, value[:100], reason)


# -- tags -------------------------------------------------------------------------


def check_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tags as Amazon limits them: 50, 1-128 character keys, 0-256 character values."""
    if len(tags) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"Too many tags: a queue has at most {MAX_TAGS}.")
    for key, value in tags.items():
        if not 1 <= len(key) <= MAX_TAG_KEY:
            raise _invalid("Tags", key, f"A tag key has 1-{MAX_TAG_KEY} characters.")
        if len(value) > MAX_TAG_VALUE:
            raise _invalid("Tags", key, f"A tag value has at most {MAX_TAG_VALUE} characters.")
    return tags


def _merged_tags(current: dict[str, str], add: dict[str, str], name: str) -> dict[str, str]:
    merged = {**current, **add}
    if len(merged) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"Too many tags added for queue {name}: "
                       f"a queue has at most {MAX_TAGS} tags.")
    return merged


async def tag_queue(call: Call) -> dict[str, Any]:
    tags = check_tags(string_map(call.params, "Tags"))
    if not tags:
        raise missing("Tags")
    queue = await call.queue()
    name = call.queue_name or ""
    await call.run(queue.update_setting, "tags", lambda current: _merged_tags(current, tags, name))
    return {}


async def untag_queue(call: Call) -> dict[str, Any]:
    keys = set(string_list(call.params, "TagKeys"))
    if not keys:
        raise missing("TagKeys")
    queue = await call.queue()
    await call.run(queue.update_setting, "tags",
                   lambda current: {key: value for key, value in current.items() if key not in keys})
    return {}


async def list_queue_tags(call: Call) -> dict[str, Any]:
    queue = await call.queue()
    tags = (await call.settings(queue))["tags"]
    return {"Tags": dict(tags)} if tags else {}


# -- permissions (stored in the Policy attribute, never enforced) ------------------


def _policy_doc(text: str | None, arn: str) -> dict[str, Any]:
    try:
        doc = load_json(text) if text else {}
    except ValueError:  # (a policy stored by another program): replaced, as one that is not ours
        doc = {}
    if not isinstance(doc, dict) or not isinstance(doc.get("Statement"), list):
        doc = {"Version": "2008-10-17", "Id": f"{arn}/SQSDefaultPolicy", "Statement": []}
    return doc


def _one_or_list(items: list[str]) -> str | list[str]:
    """A policy's principals or actions as Amazon writes them: one as a string, more as a list."""
    return items[0] if len(items) == 1 else items


async def add_permission(call: Call) -> dict[str, Any]:
    label = required_string(call.params, "Label")
    if not 1 <= len(label) <= 80 or not set(label) <= _LABEL_CHARS:
        raise _invalid("Label", label, "Up to 80 alphanumeric characters, hyphens (-) and underscores (_).")
    accounts = string_list(call.params, "AWSAccountIds")
    actions = string_list(call.params, "Actions")
    if not accounts:
        raise missing("AWSAccountIds")
    if not actions:
        raise missing("Actions")
    for action in actions:
        if action not in PERMISSION_ACTIONS:
            raise _invalid("ActionName", f"SQS:{action}", "Please refer to the appropriate WSDL for a list of valid "
                           "actions. ")  # (Amazon's words, its final space too)
    queue = await call.queue()
    arn = call.arn_of(call.queue_name or "")
    statement = {"Sid": label, "Effect": "Allow",
                 "Principal": {"AWS": _one_or_list([f"arn:aws:iam::{account}:root" for account in accounts])},
                 "Action": _one_or_list([f"SQS:{action}" for action in actions]), "Resource": arn}

    def add(text: str | None) -> str:
        doc = _policy_doc(text, arn)
        if any(isinstance(s, dict) and s.get("Sid") == label for s in doc["Statement"]):
            raise _invalid("Label", label, "Already exists.")
        doc["Statement"].append(statement)
        return json.dumps(doc, separators=(",", ":"))

    try:
        await call.run(queue.update_setting, "policy", add)
    except InvalidArgument as exc:  # the policy grew over its size limit
        raise SqsError("OverLimit", str(exc)) from None
    return {}


async def remove_permission(call: Call) -> dict[str, Any]:
    label = required_string(call.params, "Label")
    queue = await call.queue()
    arn = call.arn_of(call.queue_name or "")

    def remove(text: str | None) -> str | None:
        doc = _policy_doc(text, arn)
        kept = [s for s in doc["Statement"] if not (isinstance(s, dict) and s.get("Sid") == label)]
        if len(kept) == len(doc["Statement"]):
            raise _invalid("Label", label, "can't find label.")
        doc["Statement"] = kept
        return json.dumps(doc, separators=(",", ":")) if kept else None

    await call.run(queue.update_setting, "policy", remove)
    return {}


# -- dead-letter sources ---------------------------------------------------------


def _page(call: Call, names: list[str]) -> tuple[list[str], str | None]:
    """One page of sorted ``names`` after NextToken, MaxResults long (1..1000)."""
    limit = integer(call.params, "MaxResults", 1, MAX_LIST_RESULTS)
    token = string(call.params, "NextToken")
    after = ""
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
        except (ValueError, UnicodeError):
            raise SqsError("InvalidParameterValue", "NextToken is not one this gateway gave out.") from None
    names = [name for name in names if name > after]
    shown = names[: limit or MAX_LIST_RESULTS]
    more = limit is not None and len(names) > len(shown)
    return shown, base64.urlsafe_b64encode(shown[-1].encode("utf-8")).decode("ascii") if more else None


async def list_dead_letter_source_queues(call: Call) -> dict[str, Any]:
    queue = await call.queue()
    root = call.gateway.spool.root
    paths = await call.run(queue.dead_letter_sources)
    names = sorted(os.path.basename(path) for path in paths if os.path.dirname(path) == root)
    shown, token = _page(call, names)
    result: dict[str, Any] = {"queueUrls": [call.url_of(name) for name in shown]}
    if token:
        result["NextToken"] = token
    return result


# -- message move tasks (redrive) ---------------------------------------------------


def _queue_of_arn(parameter: str, arn: str) -> tuple[str, str]:
    """(region, queue name) of a queue ARN (the region as written: :func:`_existing` checks it)."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs":
        raise _invalid(parameter, arn, "It is not a queue ARN (arn:aws:sqs:REGION:ACCOUNT:QUEUE).")
    try:
        return parts[3], check_queue_name(parts[5])
    except InvalidArgument as exc:
        raise _invalid(parameter, arn, str(exc)) from None


def _not_found(parameter: str) -> SqsError:
    return SqsError("ResourceNotFoundException", f"The resource that you specified for the {parameter} "
                    "parameter doesn't exist.")


async def _existing(call: Call, region: str, name: str, parameter: str) -> tuple[Gateway, Queue]:
    """The queue ``parameter`` (an ARN) names, in its region's spool, with that spool's
    gateway; Amazon's ResourceNotFoundException (404) if there is none (nor a spool for its region)."""
    gateway = call.in_region(region)
    if gateway is None:
        raise _not_found(parameter)
    try:
        return gateway, await call.run(gateway.queue, name)
    except QueueNotFound:
        raise _not_found(parameter) from None


# A redrive task's id as SQS shows it (in its TaskHandle): a name-based UUID
# (RFC 9562, version 5) of the vsqs task id, which the face treats as opaque.
_TASK_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:vsqs:redrive-task")


def _task_uuid(task_id: str) -> str:
    return str(uuid.uuid5(_TASK_NAMESPACE, task_id))


def _task_handle(task_id: str, source_arn: str) -> str:
    """Amazon's TaskHandle is opaque; Amazon's own is base64 JSON of the task's
    UUID and the source queue's ARN, and so is this one."""
    doc = json.dumps({"taskId": _task_uuid(task_id), "sourceArn": source_arn}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode("ascii")


def _cancel_task(source: Queue, handle_id: str) -> dict[str, Any] | None:
    """Cancel the task of ``source`` that a handle's ``taskId`` names (blocking):
    its UUID, or the vsqs task id itself (what the handles of gateways of earlier
    vsqs releases carry: mixed versions may share a spool). Its state, ``None`` if no
    task has it or the task is no longer running."""
    for task in source.redrive_tasks():  # at most a few kept tasks (FORMAT.md, Redrive tasks)
        if handle_id in (_task_uuid(task["id"]), task["id"]):
            try:
                return source.cancel_redrive(task["id"])
            except InvalidArgument:
                return None  # finished: Amazon knows only running tasks by their handle
    return None


async def start_message_move_task(call: Call) -> dict[str, Any]:
    source_arn = required_string(call.params, "SourceArn")
    region, source_name = _queue_of_arn("SourceArn", source_arn)
    destination_arn = string(call.params, "DestinationArn")
    rate = integer(call.params, "MaxNumberOfMessagesPerSecond", 1, MAX_MOVE_RATE)
    source_gateway, source = await _existing(call, region, source_name, "SourceArn")
    destination = None
    if destination_arn:
        to_region, destination_name = _queue_of_arn("DestinationArn", destination_arn)
        to_gateway, destination = await _existing(call, to_region, destination_name, "DestinationArn")
        if to_gateway is not source_gateway:  # (a spool's queues move messages among themselves)
            raise _invalid("DestinationArn", destination_arn,
                           "The destination queue must be in the same region as the source queue.")
    if not await call.run(source.dead_letter_sources):
        raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")
    try:
        task = await call.run(source.start_redrive, destination, per_second=rate)
    except InvalidArgument:  # (the rate is checked above: another task of the queue is active)
        raise SqsError("InvalidParameterValue", "There is already a task running. Only one active task is "
                       "allowed for a source queue arn at a given time.") from None
    return {"TaskHandle": _task_handle(task["id"], call.arn_of(source_name, source_gateway.region))}


async def list_message_move_tasks(call: Call) -> dict[str, Any]:
    source_arn = required_string(call.params, "SourceArn")
    region, source_name = _queue_of_arn("SourceArn", source_arn)
    limit = integer(call.params, "MaxResults", 1, MAX_MOVE_TASKS) or 1
    gateway, source = await _existing(call, region, source_name, "SourceArn")
    tasks = (await call.run(source.redrive_tasks))[:limit]
    root = gateway.spool.root

    def arn_of(name: str) -> str:
        return call.arn_of(name, gateway.region)

    results = []
    for task in tasks:
        entry: dict[str, Any] = {"Status": task["status"], "SourceArn": arn_of(source_name),
                                 "ApproximateNumberOfMessagesMoved": task["moved"],
                                 "ApproximateNumberOfMessagesToMove": task["to_move"],
                                 "StartedTimestamp": int(task["started"] * 1000)}
        if task["status"] == "RUNNING":
            entry["TaskHandle"] = _task_handle(task["id"], arn_of(source_name))
        destination = task["destination"]
        if destination and os.path.dirname(destination) == root:
            entry["DestinationArn"] = arn_of(os.path.basename(destination))
        if task["per_second"]:
            entry["MaxNumberOfMessagesPerSecond"] = task["per_second"]
        if task["failure"]:  # Amazon's code for a destination that is gone; never a path of the spool
            gone = task["failure"].startswith("QueueNotFound")
            entry["FailureReason"] = "AWS.SimpleQueueService.NonExistentQueue" if gone \
                else without_paths(task["failure"], root)
        results.append(entry)
    return {"Results": results}


async def cancel_message_move_task(call: Call) -> dict[str, Any]:
    handle = required_string(call.params, "TaskHandle")
    try:
        doc = load_json(base64.urlsafe_b64decode(handle.encode("ascii")))
        task_id, source_arn = doc["taskId"], doc["sourceArn"]
        assert isinstance(task_id, str) and isinstance(source_arn, str)
        region, source_name = _queue_of_arn("TaskHandle", source_arn)
    except (ValueError, UnicodeError, KeyError, TypeError, AssertionError, SqsError):
        raise SqsError("InvalidParameterValue", "Value for parameter TaskHandle is invalid.") from None
    _, source = await _existing(call, region, source_name, "SourceArn")
    task = await call.run(_cancel_task, source, task_id)
    if task is None:
        raise SqsError("ResourceNotFoundException", "Task does not exist.")
    return {"ApproximateNumberOfMessagesMoved": task["moved"]}


MANAGEMENT_ACTIONS = {
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "AddPermission": add_permission,
    "RemovePermission": remove_permission,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
}
