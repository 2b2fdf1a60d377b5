"""Commands on messages: ``publish``, ``receive``, ``delete``,
``change-visibility`` and ``ls`` (a look that changes nothing)."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, BinaryIO

import click

from vsqs import Message
from vsqs._cli.options import EXIT_EMPTY, open_queue, queue_argument, visibility_option
from vsqs._cli.text import terminal_text

_PUBLISH_CHUNK = 500


def _attribute(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    attributes = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep:
            raise click.BadParameter(f"expected NAME=VALUE, not {value!r}")
        attributes[key] = text
    return attributes


@click.command()
@queue_argument
@click.argument("message", required=False)
@click.option("--lines", is_flag=True, help="Publish each line of stdin as a message.")
@click.option(
    "--delay", type=click.FloatRange(min=0), default=None,
    help="Seconds before the message becomes visible (default: the queue's delay setting).",
)
@click.option("--at", type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M"]),
              default=None, help="Local time at which the message becomes visible.")
@click.option("--priority", type=click.IntRange(0, 9), default=0, show_default=True, help="Higher goes first.")
@click.option("--group", default=None, help="Message group: delivered in order, one at a time (group_concurrency).")
@click.option("--dedup-id", default=None, help="Store nothing if a message with this id is in the queue.")
@click.option("--dedup-content", is_flag=True, help="De-duplicate by the SHA-256 of each body.")
@click.option("-a", "--attribute", "attributes", multiple=True, callback=_attribute, metavar="NAME=VALUE",
              help="A message attribute (repeatable).")
@click.option("--durable/--no-durable", default=True, show_default=True, help="fsync before returning.")
@click.option("--create", "create_queue", is_flag=True, help="Create QUEUE if missing.")
@click.pass_context
def publish(
    ctx: click.Context,
    queue: str,
    message: str | None,
    lines: bool,
    delay: float | None,
    at: Any,
    priority: int,
    attributes: dict[str, str],
    group: str | None,
    dedup_id: str | None,
    dedup_content: bool,
    durable: bool,
    create_queue: bool,
) -> None:
    """Publish MESSAGE (or stdin) to QUEUE; print the message ids."""
    q = open_queue(ctx, queue, create=create_queue)
    options: dict[str, Any] = {
        "delay": delay, "at": at, "priority": priority, "attributes": attributes,
        "group": group, "durable": durable, "dedup": "content" if dedup_content else None,
    }
    if dedup_id is not None and lines:
        raise click.UsageError("--dedup-id names one message; with --lines use --dedup-content")
    if message is not None:
        if lines:
            raise click.UsageError("--lines reads stdin; give no MESSAGE with it")
        click.echo(terminal_text(q.publish(message, dedup_id=dedup_id, **options)))
        return
    stdin = sys.stdin.buffer
    if not lines:
        click.echo(terminal_text(q.publish(stdin.read(), dedup_id=dedup_id, **options)))
        return
    with _Progress(stdin) as progress:
        for chunk in _line_chunks(stdin):
            for message_id in q.publish_batch(chunk, **options):
                click.echo(terminal_text(message_id))
            progress.advance(len(chunk), sum(len(line) + 1 for line in chunk))


def _line_chunks(stream: BinaryIO) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for line in stream:
        chunk.append(line[:-1] if line.endswith(b"\n") else line)
        if len(chunk) >= _PUBLISH_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Progress:
    """A progress bar on stderr when it is a terminal: by bytes if stdin is a
    regular file, else a running count."""

    def __init__(self, stream: BinaryIO) -> None:
        self.enabled = sys.stderr.isatty()
        self.count = 0
        self.bar: Any = None
        if self.enabled:
            try:
                size = os.fstat(stream.fileno()).st_size
            except (OSError, ValueError):
                size = 0
            if size:
                self.bar = click.progressbar(length=size, label="publishing", file=sys.stderr)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def advance(self, messages: int, nbytes: int) -> None:
        self.count += messages
        if self.bar is not None:
            self.bar.update(nbytes)
        elif self.enabled:
            click.echo(f"\rpublished {self.count:,} messages", nl=False, err=True)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        elif self.enabled and self.count:
            click.echo(err=True)


def _message_json(m: Message) -> str:
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    doc = {
        "id": m.id,
        "receipt": m.receipt,
        "body": body,
        "body_encoding": encoding,
        "receive_count": m.receive_count,
        "sent_at": m.sent_at,
    }
    return json.dumps(doc)


def _body_for(body: bytes, terminal: bool) -> bytes:
    """A body as is for a pipe or a file (it is data); for a terminal, what
    the terminal would act on is escaped (in its encoding, or escaped too)."""
    if not terminal:
        return body
    return terminal_text(body, multiline=True).encode(sys.stdout.encoding or "utf-8", "backslashreplace")


@click.command()
@queue_argument
@visibility_option
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=None,
    help="Long-poll: wait up to this many seconds for a message "
    "[default: the queue's receive_wait setting, 0 unless configured].",
)
@click.option("-n", "--max-messages", type=click.IntRange(1, 10_000), default=1, show_default=True)
@click.option("--delete", is_flag=True, help="Delete the messages once printed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message (JSON lines).")
@click.pass_context
def receive(
    ctx: click.Context,
    queue: str,
    visibility_timeout: float | None,
    wait: float | None,
    max_messages: int,
    delete: bool,
    as_json: bool,
) -> None:
    """Receive messages from QUEUE and print them.

    The body goes to stdout as is (one line per message when -n > 1; on a
    terminal, with control characters escaped); the receipt, needed to
    delete, goes to stderr unless --delete or --json.
    An empty queue prints nothing and exits with status 3.
    """
    q = open_queue(ctx, queue)
    got = q.receive_batch(max_messages, visibility_timeout=visibility_timeout, wait=wait)
    if not got:
        if q.throttled():
            click.echo("vsqs: throttled: the queue's receive budget for this window is spent", err=True)
        ctx.exit(EXIT_EMPTY)
    out = sys.stdout.buffer
    terminal = sys.stdout.isatty()
    for m in got:
        if as_json:
            out.write(_message_json(m).encode() + b"\n")
        else:
            out.write(_body_for(m.body, terminal) + (b"\n" if max_messages > 1 else b""))
            if not delete:
                click.echo(f"receipt: {terminal_text(m.receipt)}", err=True)
        out.flush()
        if delete:
            m.delete()


@click.command()
@queue_argument
@click.argument("receipts", nargs=-1, required=True, metavar="RECEIPT...")
@click.pass_context
def delete(ctx: click.Context, queue: str, receipts: tuple[str, ...]) -> None:
    """Delete the messages held by RECEIPTs ('-' reads receipts from stdin, one a line).

    Each receipt succeeds or fails on its own; failures are reported one a
    line on stderr, and the status is 1 if any failed.
    """
    q = open_queue(ctx, queue)
    if receipts == ("-",):
        receipts = tuple(line.strip() for line in sys.stdin if line.strip())
    if len(receipts) == 1:
        q.delete(receipts[0])
        return
    failed = 0
    for outcome in q.delete_batch(receipts):
        if outcome is not None:
            failed += 1
            click.echo(f"vsqs: error: {terminal_text(str(outcome))}", err=True)
    if failed:
        ctx.exit(1)


@click.command("change-visibility")
@queue_argument
@click.argument("receipt")
@click.argument("seconds", type=click.FloatRange(min=0))
@click.pass_context
def change_visibility(ctx: click.Context, queue: str, receipt: str, seconds: float) -> None:
    """Hide the message held by RECEIPT for SECONDS from now; print the new receipt."""
    click.echo(terminal_text(open_queue(ctx, queue).change_visibility(receipt, seconds)))


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


@click.command("ls")
@queue_argument
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.pass_context
def ls(ctx: click.Context, queue: str, as_json: bool) -> None:
    """List QUEUE's messages in delivery order (changes nothing)."""
    for info in open_queue(ctx, queue).messages():
        if as_json:
            doc = {
                "id": info.id,
                "state": info.state,
                "receive_count": info.receive_count,
                "sent_at": info.sent_at,
                "visible_at": info.visible_at,
            }
            click.echo(json.dumps(doc))
        else:
            click.echo(terminal_text(f"{info.id}  {info.state:<9} {info.receive_count:>3}  {_iso(info.sent_at)}"))


COMMANDS = (publish, receive, delete, change_visibility, ls)
