"""The ``vsqs`` command line: each command opens a Queue and makes one call.

Exit status: 0 success, 1 a vsqs error (one line on stderr), 2 bad usage,
3 ``receive`` found the queue empty.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, BinaryIO

import click

from vsqs._core import settings as _settings
from vsqs._core.errors import VsqsError
from vsqs._core.message import Message
from vsqs._core.queue import Queue
from vsqs._version import __version__
from vsqs._core.worker import Worker

EXIT_EMPTY = 3
_PUBLISH_CHUNK = 500


class _Group(click.Group):
    """Prints a vsqs error as one line on stderr, with status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except VsqsError as exc:
            click.echo(f"vsqs: error: {exc}", err=True)
            ctx.exit(1)
        except BrokenPipeError:  # `vsqs ls q | head`
            sys.stderr.close()
            ctx.exit(1)


def _seconds(name: str, default: float, help: str, envvar: str | None = None) -> Any:
    return click.option(
        name, type=click.FloatRange(min=0), default=default, show_default=True, envvar=envvar, help=help
    )


_visibility = click.option(
    "--visibility-timeout",
    type=click.FloatRange(min=0),
    default=None,
    envvar="VSQS_VISIBILITY_TIMEOUT",
    help="Seconds a received message stays hidden from other consumers "
    "[default: the queue's visibility_timeout setting, 30 unless configured].",
)
_queue_arg = click.argument("queue", type=click.Path(file_okay=False, path_type=str))


def _open(ctx: click.Context, path: str, create: bool = False) -> Queue:
    return Queue(path, create=create, clock_skew=ctx.obj["clock_skew"])


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vsqs")
@click.option(
    "--clock-skew",
    type=click.FloatRange(0, 3600),
    default=0.0,
    envvar="VSQS_CLOCK_SKEW",
    help="Seconds of clock difference to allow between hosts sharing the spool.",
)
@click.pass_context
def main(ctx: click.Context, clock_skew: float) -> None:
    """vsqs: a message queue in a directory. QUEUE is the queue's directory."""
    ctx.obj = {"clock_skew": clock_skew}


def _setting_options(command: Any) -> Any:
    """One --option per queue setting, e.g. --visibility-timeout, --max-receives."""
    for key in reversed(sorted(_settings.SCHEMA)):
        command = click.option(
            "--" + key.replace("_", "-"), key, default=None, metavar="VALUE",
            help=f"Set {key} ('none' unsets)."
        )(command)
    return command


@main.command()
@_queue_arg
@click.option(
    "--shards", type=int, default=None, metavar="N",
    help="Spread the messages over N directories (a power of two up to 256; fixed at creation). "
    "For queues that stand deeper than about 100,000 messages.",
)
@_setting_options
@click.pass_context
def create(ctx: click.Context, queue: str, shards: int | None, **settings: str | None) -> None:
    """Create QUEUE (a directory with queue metadata) if it does not exist,
    and apply the settings given."""
    changes = {key: value for key, value in settings.items() if value is not None}
    _settings.validate(changes)  # a bad setting creates nothing
    q = Queue(
        queue, create=True, clock_skew=ctx.obj["clock_skew"], mode=changes.get("file_mode"), shards=shards
    )
    if changes:
        q.configure(**changes)


@main.command()
@_queue_arg
@click.argument("assignments", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@click.pass_context
def config(ctx: click.Context, queue: str, assignments: tuple[str, ...], as_json: bool) -> None:
    """Show QUEUE's settings, or change them: vsqs config jobs max_receives=5 delay=none"""
    q = _open(ctx, queue)
    changes = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep:
            raise click.UsageError(f"expected KEY=VALUE, not {assignment!r}")
        changes[key.strip().replace("-", "_")] = value.strip()
    settings = q.configure(**changes) if changes else q.settings
    if as_json:
        click.echo(json.dumps(dict(settings), sort_keys=True))
    else:
        for key in sorted(settings):
            value = settings[key]
            shown = "none" if value is None else "/".join(f"{v:g}" for v in value) if isinstance(value, list) else f"{value:g}" if isinstance(value, float) else value
            click.echo(f"{key:<19} {shown}")


def _operations_flags(command: Any) -> Any:
    for op in reversed(_settings.OPERATIONS):
        command = click.option(f"--{op}", "operations", flag_value=op, multiple=True,
                               help=f"Only {op}.")(command)
    return command


@main.command()
@_queue_arg
@_operations_flags
@click.pass_context
def suspend(ctx: click.Context, queue: str, operations: tuple[str, ...]) -> None:
    """Suspend publish, receive and/or delete on QUEUE for every process (all if none given)."""
    q = _open(ctx, queue)
    q.suspend(*operations)
    click.echo("suspended: " + ", ".join(q.settings["suspended"]))


@main.command()
@_queue_arg
@_operations_flags
@click.pass_context
def resume(ctx: click.Context, queue: str, operations: tuple[str, ...]) -> None:
    """Resume suspended operations on QUEUE (all if none given)."""
    q = _open(ctx, queue)
    q.resume(*operations)
    click.echo("suspended: " + (", ".join(q.settings["suspended"]) or "nothing"))


@main.command()
@_queue_arg
@click.option("--to", "to", type=click.Path(file_okay=False), help="Move here instead of each message's own queue.")
@click.option("--max-messages", type=click.IntRange(min=0), default=None)
@click.pass_context
def redrive(ctx: click.Context, queue: str, to: str | None, max_messages: int | None) -> None:
    """Move messages of the dead-letter QUEUE back to their queues (count reset)."""
    q = _open(ctx, queue)
    target = _open(ctx, to) if to else None
    click.echo(f"redrove {q.redrive(target, max_messages=max_messages)} messages")


def _attribute(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    attributes = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep:
            raise click.BadParameter(f"expected NAME=VALUE, not {value!r}")
        attributes[key] = text
    return attributes


@main.command()
@_queue_arg
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
    q = _open(ctx, queue, create=create_queue)
    options: dict[str, Any] = {
        "delay": delay, "at": at, "priority": priority, "attributes": attributes,
        "group": group, "durable": durable, "dedup": "content" if dedup_content else None,
    }
    if dedup_id is not None and lines:
        raise click.UsageError("--dedup-id names one message; with --lines use --dedup-content")
    if message is not None:
        if lines:
            raise click.UsageError("--lines reads stdin; give no MESSAGE with it")
        click.echo(q.publish(message, dedup_id=dedup_id, **options))
        return
    stdin = sys.stdin.buffer
    if not lines:
        click.echo(q.publish(stdin.read(), dedup_id=dedup_id, **options))
        return
    with _Progress(stdin) as progress:
        for chunk in _line_chunks(stdin):
            for message_id in q.publish_batch(chunk, **options):
                click.echo(message_id)
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


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


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


@main.command()
@_queue_arg
@_visibility
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

    The body goes to stdout as is (one line per message when -n > 1); the
    receipt, needed to delete, goes to stderr unless --delete or --json.
    An empty queue prints nothing and exits with status 3.
    """
    q = _open(ctx, queue)
    got = q.receive_batch(max_messages, visibility_timeout=visibility_timeout, wait=wait)
    if not got:
        if q.throttled():
            click.echo("vsqs: throttled: the queue's receive budget for this window is spent", err=True)
        ctx.exit(EXIT_EMPTY)
    out = sys.stdout.buffer
    for m in got:
        if as_json:
            out.write(_message_json(m).encode() + b"\n")
        else:
            out.write(m.body + (b"\n" if max_messages > 1 else b""))
            if not delete:
                click.echo(f"receipt: {m.receipt}", err=True)
        out.flush()
        if delete:
            m.delete()


@main.command()
@_queue_arg
@click.argument("receipts", nargs=-1, required=True, metavar="RECEIPT...")
@click.pass_context
def delete(ctx: click.Context, queue: str, receipts: tuple[str, ...]) -> None:
    """Delete the messages held by RECEIPTs ('-' reads receipts from stdin, one a line).

    Each receipt succeeds or fails on its own; failures are reported one a
    line on stderr, and the status is 1 if any failed.
    """
    q = _open(ctx, queue)
    if receipts == ("-",):
        receipts = tuple(line.strip() for line in sys.stdin if line.strip())
    if len(receipts) == 1:
        q.delete(receipts[0])
        return
    failed = 0
    for outcome in q.delete_batch(receipts):
        if outcome is not None:
            failed += 1
            click.echo(f"vsqs: error: {outcome}", err=True)
    if failed:
        ctx.exit(1)


@main.command("change-visibility")
@_queue_arg
@click.argument("receipt")
@click.argument("seconds", type=click.FloatRange(min=0))
@click.pass_context
def change_visibility(ctx: click.Context, queue: str, receipt: str, seconds: float) -> None:
    """Hide the message held by RECEIPT for SECONDS from now; print the new receipt."""
    click.echo(_open(ctx, queue).change_visibility(receipt, seconds))


def _prometheus_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _stats_fields(q: Queue, groups: bool) -> dict[str, Any]:
    s = q.stats(groups=groups)
    fields: dict[str, Any] = {
        "ready": s.ready,
        "in_flight": s.in_flight,
        "delayed": s.delayed,
        "dead_lettered": s.dead_lettered,
        "oldest_ready_age": round(s.oldest_ready_age, 6),
        "writing": s.writing,
        "shards": q.shards,
    }
    if groups:
        fields["groups"] = s.groups
    return fields


def _prometheus(q: Queue, fields: dict[str, Any]) -> str:
    labels = f'queue="{_prometheus_label(os.path.basename(q.path))}",path="{_prometheus_label(q.path)}"'
    lines = [
        "# HELP vsqs_messages Messages in the queue, by state.",
        "# TYPE vsqs_messages gauge",
        *(f'vsqs_messages{{{labels},state="{state}"}} {fields[state]}' for state in ("ready", "in_flight", "delayed")),
        "# HELP vsqs_dead_lettered_messages Messages of this queue now in its dead-letter queue.",
        "# TYPE vsqs_dead_lettered_messages gauge",
        f"vsqs_dead_lettered_messages{{{labels}}} {fields['dead_lettered']}",
        "# HELP vsqs_oldest_message_age_seconds Seconds since the oldest visible message was sent.",
        "# TYPE vsqs_oldest_message_age_seconds gauge",
        f"vsqs_oldest_message_age_seconds{{{labels}}} {fields['oldest_ready_age']}",
    ]
    if fields.get("groups"):
        lines += [
            "# HELP vsqs_group_messages Messages of each message group, by state.",
            "# TYPE vsqs_group_messages gauge",
        ]
        for group, tally in sorted(fields["groups"].items()):
            for state, count in tally.items():
                group_label = f'group="{_prometheus_label(group)}"'
                lines.append(f'vsqs_group_messages{{{labels},{group_label},state="{state}"}} {count}')
    return "\n".join(lines)


@main.command()
@_queue_arg
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--prometheus", is_flag=True, help="node-exporter textfile collector format.")
@click.option("--groups", is_flag=True, help="Also count per message group.")
@click.option("--watch", is_flag=True, help="Refresh in place until interrupted.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.pass_context
def stats(
    ctx: click.Context, queue: str, as_json: bool, prometheus: bool, groups: bool, watch: bool, interval: float
) -> None:
    """Print QUEUE's message counts by state and the oldest ready message's age.

    For the node-exporter textfile collector, write to a temporary file and
    rename it into the collector's directory:
    vsqs stats --prometheus q > q.prom.tmp && mv q.prom.tmp /var/lib/node_exporter/q.prom
    """
    q = _open(ctx, queue)
    shown = 0
    while True:
        fields = _stats_fields(q, groups)
        if as_json:
            text = json.dumps(fields)
        elif prometheus:
            text = _prometheus(q, fields)
        else:
            group_counts = fields.pop("groups", None) or {}
            rows = [f"{key:<17} {value}" for key, value in fields.items()]
            rows += [
                f"group {name}: " + ", ".join(f"{state} {count}" for state, count in tally.items())
                for name, tally in sorted(group_counts.items())
            ]
            text = "\n".join(rows)
        if watch and shown and sys.stdout.isatty():
            click.echo(f"\x1b[{shown}F\x1b[J", nl=False)  # back to the top of the last print
        click.echo(text)
        if not watch:
            return
        shown = text.count("\n") + 1
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


@main.command("ls")
@_queue_arg
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.pass_context
def ls(ctx: click.Context, queue: str, as_json: bool) -> None:
    """List QUEUE's messages in delivery order (changes nothing)."""
    for info in _open(ctx, queue).messages():
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
            click.echo(f"{info.id}  {info.state:<9} {info.receive_count:>3}  {_iso(info.sent_at)}")


@main.command()
@_queue_arg
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def purge(ctx: click.Context, queue: str, yes: bool) -> None:
    """Delete every message in QUEUE, in flight and delayed included."""
    q = _open(ctx, queue)
    if not yes:
        click.confirm(f"Delete every message in {q.path}?", abort=True, err=True)
    click.echo(f"purged {q.purge()} messages")


@main.command()
@_queue_arg
@_seconds("--grace", 900.0, "Remove .new files older than this (publishers that died).")
@click.pass_context
def gc(ctx: click.Context, queue: str, grace: float) -> None:
    """Requeue expired messages and remove files of dead publishers."""
    q = _open(ctx, queue)
    requeued = q.requeue_expired()
    removed = q.collect_garbage(grace=grace)
    click.echo(f"requeued {requeued} expired messages, removed {removed} files (orphans, past retention)")


class _CommandRunner:
    """Runs COMMAND once per message, body on stdin; remembers children for a cold stop."""

    def __init__(self, command: tuple[str, ...], queue: Queue) -> None:
        self.command = command
        self.queue = queue
        self.children: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()

    def __call__(self, m: Message) -> None:
        env = dict(os.environ, VSQS_MESSAGE_ID=m.id, VSQS_RECEIVE_COUNT=str(m.receive_count),
                   VSQS_QUEUE=self.queue.path)
        try:
            child = subprocess.Popen(self.command, stdin=subprocess.PIPE, env=env)
        except OSError as exc:
            raise RuntimeError(f"cannot run {self.command[0]}: {exc}") from exc
        with self.lock:
            self.children.add(child)
        try:
            child.communicate(m.body)
        finally:
            with self.lock:
                self.children.discard(child)
        if child.returncode != 0:
            raise RuntimeError(f"{self.command[0]} exited with status {child.returncode}")

    def terminate_all(self) -> None:
        with self.lock:
            for child in self.children:
                child.terminate()


@main.command(context_settings={"ignore_unknown_options": True})
@_queue_arg
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_visibility
@_seconds("--wait", 5.0, "Seconds each receive long-polls before trying again (or stopping, with --burst).")
@_seconds("--retry-delay", 0.0, "Seconds a failed message stays hidden before its retry.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-messages", type=click.IntRange(min=0), default=None, help="Stop after this many.")
@click.option("--burst", is_flag=True, help="Stop when the queue is empty.")
@click.option("-v", "--verbose", is_flag=True, help="Print a summary line at the end.")
@click.pass_context
def work(
    ctx: click.Context,
    queue: str,
    command: tuple[str, ...],
    visibility_timeout: float | None,
    wait: float,
    retry_delay: float,
    concurrency: int,
    max_messages: int | None,
    burst: bool,
    verbose: bool,
) -> None:
    """Run COMMAND once per message of QUEUE, with the body on stdin.

    \b
        vsqs work jobs -- ./handle.sh --flag
    Exit 0 deletes the message; any other status makes it visible again
    (after --retry-delay). A long COMMAND keeps its message hidden. The first
    SIGINT/SIGTERM lets running commands finish; a second one terminates them.
    """
    if visibility_timeout is not None and visibility_timeout <= 0:
        raise click.BadParameter("must be > 0 for a worker", param_hint="--visibility-timeout")
    q = _open(ctx, queue)
    runner = _CommandRunner(command, q)
    worker = Worker(
        q,
        runner,
        visibility_timeout=visibility_timeout,
        wait=wait,
        concurrency=concurrency,
        max_messages=max_messages,
        burst=burst,
        retry_delay=retry_delay,
    )

    def on_signal(signum: int, frame: object) -> None:
        if worker.stopping:
            runner.terminate_all()
        worker.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        result = worker.work()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if verbose:
        click.echo(
            f"vsqs work: processed {result.processed}, failed {result.failed}, "
            f"lost {result.lost} in {time.monotonic() - started:.1f}s",
            err=True,
        )


@main.command("check-fs")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--other", type=click.Path(exists=True, file_okay=False), default=None,
              help="The same directory as another host (another mount) sees it.")
@click.option("--processes", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--rounds", type=click.IntRange(10, 100_000), default=500, show_default=True)
def check_fs(directory: str, other: str | None, processes: int, rounds: int) -> None:
    """Check that DIRECTORY's filesystem has what vsqs relies on.

    Races exclusive creates and renames between processes (and between two
    mounts with --other), tries fsync, compares the file clock with this
    host's, and measures the claim cycle. Exit status 1 if a check fails.
    """
    from vsqs._cli.checkfs import run_checks

    failed = False
    for check in run_checks(directory, other, processes, rounds):
        click.echo(f"{check.status:<5} {check.name:<20} {check.detail}")
        failed = failed or check.status == "FAIL"
    if failed:
        raise SystemExit(1)


def _read_secret_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        secret = f.readline().strip()
    if not secret:
        raise click.BadParameter(f"{path} is empty", param_hint="--api-key-file")
    return secret


def _aws_credentials(path: str | None) -> dict[str, str]:
    """Access key id -> secret, from the environment and an AWS shared-credentials
    file (every profile with aws_access_key_id and aws_secret_access_key)."""
    import configparser

    found: dict[str, str] = {}
    key_id, secret = os.environ.get("VSQS_AWS_ACCESS_KEY_ID"), os.environ.get("VSQS_AWS_SECRET_ACCESS_KEY")
    if bool(key_id) != bool(secret):
        raise click.UsageError("set both VSQS_AWS_ACCESS_KEY_ID and VSQS_AWS_SECRET_ACCESS_KEY, or neither")
    if key_id and secret:
        found[key_id] = secret
    if path:
        parser = configparser.ConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except configparser.Error as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="--aws-credentials-file") from None
        for profile in parser.sections():
            section = parser[profile]
            if section.get("aws_access_key_id") and section.get("aws_secret_access_key"):
                found[section["aws_access_key_id"].strip()] = section["aws_secret_access_key"].strip()
        if not found:
            raise click.BadParameter(f"{path} holds no aws_access_key_id/aws_secret_access_key pair",
                                     param_hint="--aws-credentials-file")
    return found


@main.command()
@click.argument("spool", type=click.Path(file_okay=False, path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback unless told).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Worker processes (they share nothing but the spool).")
@click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File whose first line is the API key of the native API [default: $VSQS_API_KEY].")
@click.option("--aws-credentials-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="AWS shared-credentials file: the key pairs the SQS face accepts "
              "[also $VSQS_AWS_ACCESS_KEY_ID and $VSQS_AWS_SECRET_ACCESS_KEY].")
@click.option("--region", default="us-east-1", show_default=True, help="Region in queue ARNs and signatures.")
@click.option("--max-message-bytes", type=click.IntRange(1, 64 * 1024 * 1024), default=1024 * 1024,
              show_default=True, help="Largest body the gateway takes (a queue's own limit may be lower).")
@click.option("--file-mode", default=None, metavar="MODE",
              help="Octal mode for the queues the gateway creates, e.g. 660 for a group-shared spool.")
@click.option("--limit-concurrency", type=click.IntRange(1), default=None,
              help="Answer 503 past this many open connections and requests per worker [default: no limit].")
@click.option("--create", is_flag=True, help="Create SPOOL if it does not exist.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
def serve(
    spool: str, host: str, port: int, workers: int, api_key_file: str | None, aws_credentials_file: str | None,
    region: str, max_message_bytes: int, file_mode: str | None, limit_concurrency: int | None, create: bool,
    log_level: str,
) -> None:
    """Serve SPOOL over HTTP: the native API under /queues and the Amazon SQS
    protocol on POST / (needs the extra: pip install 'vsqs[server]').

    The gateway keeps no state: run as many as you like, on any hosts sharing
    the spool. TLS belongs to a reverse proxy in front.
    """
    try:
        from vsqs._gateway.app import GatewayConfig
        from vsqs._gateway.app import serve as run
    except ImportError as exc:
        raise click.ClickException(f"vsqs serve needs the server extra: pip install 'vsqs[server]' ({exc})")
    from vsqs._core.spool import Spool

    Spool(spool, create=create)  # QueueNotFound (a clear one-line error) if it is missing
    api_key = _read_secret_file(api_key_file) if api_key_file else os.environ.get("VSQS_API_KEY") or None
    if file_mode is not None:
        try:
            file_mode = _settings.validate({"file_mode": file_mode})["file_mode"]
        except VsqsError as exc:
            raise click.BadParameter(str(exc), param_hint="--file-mode") from None
    config = GatewayConfig(
        spool=os.path.abspath(spool), api_key=api_key, aws_credentials=_aws_credentials(aws_credentials_file),
        region=region, max_message_bytes=max_message_bytes, file_mode=file_mode,
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run(config, host=host, port=port, workers=workers, log_level=log_level, limit_concurrency=limit_concurrency)
