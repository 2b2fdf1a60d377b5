"""The Amazon SQS face of the gateway: the AWS JSON 1.0 protocol on ``POST /``
(or a queue URL's path, where the PHP SDK posts), and beside it SQS's Query
protocol (a form, ``POST`` or ``GET``, on ``/`` or a queue URL's path,
answered in XML, or in JSON for ``Accept: application/json``: ``query``,
``query_xml``, ``query_json``), the same actions, checks and errors in each
(``wire`` tells them apart).

An unmodified SQS client (boto3, the ``aws sqs`` command, any SDK that speaks
JSON 1.0) pointed at the gateway's URL works on the spool's queues, beside
library and CLI users of the same spool. Every action turns into calls of
the public vsqs API; file I/O runs on the gateway's thread pool.

Protocol. A request is ``POST /`` (or to a queue URL's path) with ``X-Amz-Target: AmazonSQS.<Action>``
and a JSON body; an answer is JSON (``application/x-amz-json-1.0``) with an
``x-amzn-RequestId`` header. An error is HTTP 400 (403 for a refused
signature, 500/503 for the gateway's own trouble) with the body
``{"__type": "com.amazonaws.sqs#<Name>", "message": ...}`` (the two generic
errors as Amazon names them there: ``InvalidParameterValueException``,
``MissingRequiredParameterException``) and the header
``x-amzn-query-error: <query code>;Sender`` (``Receiver`` for 5xx): botocore maps that pair to
``client.exceptions.<Name>`` (``QueueDoesNotExist`` for
``AWS.SimpleQueueService.NonExistentQueue``, ``QueueNameExists`` for
``QueueAlreadyExists``, ...). Unmodelled codes (``InvalidParameterValue``,
``MissingParameter``, ...) come back as a ``ClientError`` with that code.

Actions: CreateQueue, GetQueueUrl, ListQueues, DeleteQueue,
GetQueueAttributes, SetQueueAttributes, SendMessage(Batch), ReceiveMessage,
DeleteMessage(Batch), ChangeMessageVisibility(Batch), PurgeQueue, and in
``management``: TagQueue, UntagQueue, ListQueueTags, AddPermission,
RemovePermission, ListDeadLetterSourceQueues, StartMessageMoveTask,
ListMessageMoveTasks, CancelMessageMoveTask. An unknown target is
``UnknownOperationException``.

Decisions (beyond SQS's own rules):

- Auth: SigV4 against the configured key pairs (``vsqs._gateway.sigv4``; in
  the Query protocol the form is the signed body, or a ``GET`` is
  presigned). With none but an API key, SigV4 with the API key as the
  secret and any access key id (a key closes both faces); with neither,
  every request is accepted, signed or not, but a Query ``GET`` of an action
  that changes the spool, which needs a SigV4 ``Authorization`` header (any:
  what a web page cannot make a browser send; ``endpoint``). The region in
  the signature's scope is not checked (it only names the key derivation).
- Queue URL ``{scheme}://{Host}/{account_id}/{name}`` (``--public-url`` gives
  its start instead; the Host is one the gateway serves). A QueueUrl is
  accepted with any host and account; its last segment is the queue name.
  A bare queue name is a QueueUrl too (Amazon takes one); a QueueUrl that
  names no queue is QueueDoesNotExist, in Amazon's words.
  CreateQueue takes only SQS names (1-80 of ``A-Za-z0-9_-``, plus ``.fifo``);
  an existing queue may be addressed by any vsqs name (``jobs.dlq``), which
  never contains ``/`` or ``..``. A bad name or URL touches no file.
- FIFO: a queue is FIFO iff its name ends in ``.fifo`` (CreateQueue wants
  ``FifoQueue=true`` with the suffix and the suffix with it). A new FIFO
  queue gets ``dedup_window=300`` and ``group_concurrency=1``. Sends need a
  MessageGroupId, refuse a non-zero per-message DelaySeconds, and need a
  MessageDeduplicationId unless ContentBasedDeduplication is on.
  DeduplicationScope is the setting ``dedup_scope`` (``queue``, Amazon's
  default, for a queue made here; ``messageGroup``); FifoThroughputLimit is
  kept in ``throughput_limit`` and reported, and changes nothing (vsqs has no
  throughput quota). SendMessage(Batch) answers a SequenceNumber on a FIFO
  queue (from the message id, increasing within a group). A dedup id
  is held while its message is in the queue and 300 s after it is gone
  (SQS: 300 s after the send). MessageGroupId on a standard queue also
  becomes a vsqs group, so that group is delivered in order, one in flight.
  ReceiveMessage on a FIFO queue takes a group's next messages together, as
  Amazon (``Queue.receive_batch(group_runs=True)``).
- Queue attributes map to settings: VisibilityTimeout, DelaySeconds,
  MessageRetentionPeriod (``retention``; a queue that sets none reports
  Amazon's default, 4 days, though vsqs then keeps messages for ever; only
  ``vsqs gc`` enforces a set one),
  MaximumMessageSize (the setting, else the gateway's limit),
  ReceiveMessageWaitTimeSeconds, RedrivePolicy (``dead_letter`` and
  ``max_receives``; the target must be an existing queue of the spool of the
  same type; a policy naming the queue itself is taken, as Amazon takes it,
  and dead-letters nothing), ContentBasedDeduplication. Read-only: the three message counts
  (one listing), QueueArn, FifoQueue, CreatedTimestamp
  (:attr:`vsqs.Queue.created_at`), LastModifiedTimestamp
  (:attr:`vsqs.Queue.settings_changed_at`, else the creation). ``All`` is
  taken in any case (kombu sends ``ALL``). RedriveAllowPolicy is not
  reported; setting it is refused. Fractional settings made by the library
  are reported as decimals. Policy and the KMS/SSE attributes are settings
  kept, not obeyed (``security``); CreateQueue ``tags`` and the tag actions
  use the ``tags`` setting.
- Redrive: ListDeadLetterSourceQueues is :meth:`vsqs.Queue.dead_letter_sources`;
  a message move task is :meth:`vsqs.Queue.start_redrive` in the gateway
  process that starts it, its state on disk (any gateway lists or cancels
  it); its TaskHandle is base64url JSON ``{"taskId", "sourceArn"}``.
- Message attributes: ``String`` ones are plain vsqs attributes (library
  users see them as they are, and library attributes come back as String).
  Other types keep their value as text (Binary as base64) and their type in
  the hidden vsqs attribute ``sqs.types`` (JSON name -> DataType).
  MessageDeduplicationId and AWSTraceHeader are kept in ``sqs.dedup_id`` and
  ``sqs.trace`` (AWSTraceHeader from MessageSystemAttributes, else from the
  request's ``X-Amzn-Trace-Id`` header, X-Ray's). Attributes named ``sqs.*`` are never shown to SQS clients
  and refused from them. Message size = body + attribute names, types and
  values, as SQS counts it.
- Bodies are UTF-8 text. A body published by the library that is not UTF-8
  is delivered with U+FFFD for each bad byte; MD5OfBody is that of what is
  sent. SQS's character rule applies to sends (InvalidMessageContents).
- Receive: MessageId is the vsqs id, ReceiptHandle the vsqs receipt.
  System attributes: SenderId (the gateway's account id), SentTimestamp,
  ApproximateReceiveCount, MessageGroupId, MessageDeduplicationId (as sent,
  or the body's SHA-256 on a content-deduplicated queue), AWSTraceHeader.
  SequenceNumber (FIFO queues). ApproximateFirstReceiveTimestamp
  (:attr:`vsqs.Message.first_received_at`; left out when the message's name
  does not record it: first received by an older vsqs).
  DeadLetterQueueSourceArn (:attr:`vsqs.Message.dead_letter_source`, as an
  ARN like QueueArn; looked up in the receive's worker thread).
  ReceiveRequestAttemptId is ignored. ``All`` is taken in any case, message
  attributes also by ``*``, ``.*`` and ``prefix.*`` (the names that start
  with ``prefix``); unknown names are ignored, as Amazon ignores them.
- Receipts: vsqs gives a message a new receipt when its visibility changes,
  SQS keeps the handle. The gateway remembers, per process and in memory,
  handle -> current receipt after a ChangeMessageVisibility; a handle changed
  through another gateway process is followed with
  :meth:`vsqs.Queue.current_receipt` (one listing: the same message, the same
  receive count, still in flight). So a client that extends and then deletes
  with its first handle deletes the message, whichever gateway it talks to.
- Stale receipts: DeleteMessage with a receipt that no longer holds its
  message succeeds without deleting (SQS's documented behaviour; the
  metrics outcome is ``stale``). ChangeMessageVisibility with the handle of
  a deleted message answers Amazon's InvalidParameterValue ("... Message does
  not exist or is not available for visibility timeout change."); with the
  handle of a message still in the queue but received again since, success
  and no change (outcome ``stale``; :meth:`vsqs.Queue.message_id` tells the
  two apart). A malformed or foreign receipt is ``ReceiptHandleIsInvalid``.
- vsqs errors: QueueNotFound -> QueueDoesNotExist, QueueFull -> OverLimit,
  MessageTooLarge -> InvalidParameterValue, InvalidArgument ->
  InvalidParameterValue (InvalidAttributeValue for attributes),
  QueueSuspended -> 503 ``ServiceUnavailable`` (SDKs retry it with backoff),
  StorageError -> 500 ``InternalError`` if the disk is full, else 503
  ``ServiceUnavailable``; IncompatibleFormat -> UnsupportedOperation.
- PurgeQueue purges at once (no 60 s PurgeQueueInProgress window).
- A request over the gateway's size cap is refused by the gateway's
  middleware before it reaches this package (:func:`.wire.request_too_large`
  gives the SQS-shaped answer for it); actions that carry no message take
  128 KiB at most (``endpoint``), refused before the body is read in full.
  The body is parsed with bounded cost (``vsqs._gateway.json_body``): too many
  values is a 413 ``InvalidParameterValue``, malformed or deeply nested JSON
  ``SerializationException``, a lone surrogate ``InvalidMessageContents`` in a
  message and ``InvalidParameterValue`` elsewhere.
- Metrics: operation ``sqs.<Action>`` (``sqs.unknown`` for anything else),
  outcome ``ok``, ``stale``, ``partial`` (a batch with failed entries) or
  the error's name.

The package, one concern a module: ``protocol`` (the JSON 1.0 wire format,
errors), ``query_shapes``, ``query``, ``query_xml`` and ``query_json`` (the
Query protocol: its names, its forms read, its XML, its JSON answers), ``wire`` (a request's protocol),
``parameters`` (reading and checking parameters), ``attributes``
(queue attributes as settings, message attributes, digests), ``messages``
(sends and receives), ``receipts`` (handles across visibility changes),
``call`` (one request), ``actions`` (one function per action),
``management`` (the tag, permission and redrive actions), ``security``
(Policy and KMS attributes) and
``endpoint`` (authentication and dispatch: the route).
"""
