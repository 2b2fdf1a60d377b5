#!/usr/bin/env python3
"""The floor of ``scripts/bench_gateway.py``: a bare ASGI app under the same
server as ``vsqs serve`` (uvicorn with the gateway's own options: its HTTP
protocol class, event loop and keep-alive) that answers each workload's
requests with the same library call, made in one hop to the thread pool,
and nothing else: no routing framework, no middleware, no checks, no
metrics, no access log (but the ASGI half of the server's head deadline,
:class:`~vsqs._gateway.timeouts.BodyDeadline`).

    python scripts/_gateway_floor.py SPOOL PORT

It serves queue ``q`` of SPOOL on 127.0.0.1:PORT, and answers ``GET /healthz``
(to say it is up). What the gateway spends beyond this, request for
request, is what its routing, checks and answers cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import uvicorn

import vsqs
from vsqs._gateway.app import uvicorn_options
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.timeouts import BodyDeadline

Scope = dict[str, Any]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def make_app(queue: vsqs.Queue) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    pool = ThreadPoolExecutor(40, thread_name_prefix="floor")  # anyio's default thread count

    async def off_loop(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    async def body_of(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    async def answer(send: Send, status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
                     content_type: bytes = b"application/json") -> None:
        head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(headers or [])]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    def dump(doc: Any) -> bytes:
        return json.dumps(doc, separators=(",", ":")).encode()

    async def sqs(target: str, params: dict[str, Any]) -> dict[str, Any]:
        if target == "SendMessage":
            message_id = await off_loop(lambda: queue.publish(params["MessageBody"].encode()))
            return {"MessageId": message_id}
        if target == "SendMessageBatch":
            bodies = [entry["MessageBody"].encode() for entry in params["Entries"]]
            ids = await off_loop(lambda: queue.publish_batch(bodies))
            sent = zip(params["Entries"], ids, strict=True)
            return {"Successful": [{"Id": e["Id"], "MessageId": i} for e, i in sent], "Failed": []}
        if target == "ReceiveMessage":
            got = await off_loop(lambda: [(m.id, m.receipt, m.body.decode())
                                          for m in queue.receive_batch(params.get("MaxNumberOfMessages", 1))])
            return {"Messages": [{"MessageId": i, "ReceiptHandle": r, "Body": b} for i, r, b in got]}
        if target == "DeleteMessage":
            await off_loop(lambda: queue.delete(params["ReceiptHandle"]))
            return {}
        if target == "DeleteMessageBatch":
            entries = params["Entries"]
            await off_loop(lambda: queue.delete_batch([e["ReceiptHandle"] for e in entries]))
            return {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []}
        raise ValueError(target)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        body = await body_of(receive)
        if path == "/" and method == "POST":
            target = dict(scope["headers"]).get(b"x-amz-target", b"").decode().removeprefix("AmazonSQS.")
            result = await sqs(target, json.loads(body))
            await answer(send, 200, dump(result), content_type=b"application/x-amz-json-1.0")
        elif path == "/queues/q/messages" and method == "POST":
            message_id = await off_loop(lambda: queue.publish(body))
            await answer(send, 201, headers=[(b"message-id", message_id.encode())])
        elif path == "/queues/q/messages" and method == "GET":
            m = await off_loop(lambda: queue.receive())
            if m is None:
                await answer(send, 204)
            else:
                await answer(send, 200, m.body, [(b"message-id", m.id.encode()),
                                                 (b"message-receipt", m.receipt.encode())], b"text/plain")
        elif path.startswith("/queues/q/messages/") and method == "DELETE":
            receipt = path.rsplit("/", 1)[1]
            await off_loop(lambda: queue.delete(receipt))
            await answer(send, 204)
        elif path == "/queues/q/messages/batch":
            bodies = [entry["body"].encode() for entry in json.loads(body)["messages"]]
            ids = await off_loop(lambda: queue.publish_batch(bodies))
            await answer(send, 201, dump({"messages": [{"id": i} for i in ids]}))
        elif path == "/queues/q/messages/receive":
            count = json.loads(body).get("max_messages", 1)
            got = await off_loop(lambda: [{"id": m.id, "receipt": m.receipt, "body": m.body.decode()}
                                          for m in queue.receive_batch(count)])
            await answer(send, 200, dump({"messages": got}))
        elif path == "/queues/q/messages/delete":
            receipts = json.loads(body)["receipts"]
            await off_loop(lambda: queue.delete_batch(receipts))
            await answer(send, 200, dump({"results": [{"receipt": r} for r in receipts]}))
        elif path == "/healthz":
            await answer(send, 200, b'{"status":"ok"}')
        else:
            await answer(send, 404)

    return app


def main() -> None:
    spool, port = sys.argv[1], int(sys.argv[2])
    queue = vsqs.Spool(spool).queue("q")
    config = GatewayConfig(spool=os.path.abspath(spool))
    # the server's head deadline has an ASGI half (it hears when a request started and was answered),
    # part of the server as the gateway runs it: without it a connection would be closed mid-run
    app = BodyDeadline(make_app(queue), config.body_timeout)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                **uvicorn_options(config))


if __name__ == "__main__":
    main()
