"""Commands that operate a queue: watch it (``stats``), repair it (``gc``,
``redrive``, ``purge``), pause it (``suspend``, ``resume``), and check the
filesystem under it (``check-fs``)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

import click

from vsqs import Queue, QueueStats
from vsqs._cli.options import open_queue, queue_argument, seconds_option
from vsqs._cli.text import terminal_text
from vsqs._core import metrics
from vsqs._core import settings as _settings

_NOT_UTF8 = re.compile("[\ud800-\udfff]")  # lone surrogates: a path's undecodable bytes (surrogateescape)


def _prometheus_label(value: str) -> str:
    """A label value as the exposition format writes it: UTF-8, with the
    backslash, the double quote and the newline escaped; what cannot be UTF-8
    becomes U+FFFD. Any other character is the value's own (a terminal gets
    the whole text through ``terminal_text``)."""
    value = _NOT_UTF8.sub("\ufffd", value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _prometheus(q: Queue, s: QueueStats) -> str:
    """The queue gauges in the node-exporter textfile format, each gauge's
    HELP and TYPE before its first sample."""
    queue_labels = metrics.queue_label_values(os.path.basename(q.path))
    lines: list[str] = []
    previous = None
    for sample in metrics.queue_samples(s):
        gauge = sample.gauge
        if gauge is not previous:
            lines += [f"# HELP {gauge.name} {gauge.help}", f"# TYPE {gauge.name} gauge"]
            previous = gauge
        pairs = zip(metrics.QUEUE_LABELS + gauge.labels, queue_labels + sample.labels, strict=True)
        labels = ",".join(f'{name}="{_prometheus_label(value)}"' for name, value in pairs)
        lines.append(f"{gauge.name}{{{labels}}} {round(sample.value, 6)}")
    return "\n".join(lines)


def _stats_fields(q: Queue, s: QueueStats, groups: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ready": s.ready,
        "in_flight": s.in_flight,
        "delayed": s.delayed,
        "dead_lettered": s.dead_lettered,
        "oldest_ready_age": round(s.oldest_ready_age, 6),
        "writing": s.writing,
        "staged": s.staged,
        "shards": q.shards,
    }
    if groups:
        fields["groups"] = s.groups
    return fields


def _stats_text(q: Queue, as_json: bool, prometheus: bool, groups: bool) -> str:
    s = q.stats(groups=groups)
    if prometheus and not as_json:
        return _prometheus(q, s)
    fields = _stats_fields(q, s, groups)
    if as_json:
        return json.dumps(fields)
    group_counts = fields.pop("groups", None) or {}
    rows = [f"{key:<17} {value}" for key, value in fields.items()]
    rows += [  # a group's name is free text, from a message: one line, whatever it holds
        f"group {terminal_text(name)}: " + ", ".join(f"{state} {count}" for state, count in tally.items())
        for name, tally in sorted(group_counts.items())
    ]
    return "\n".join(rows)


@click.command()
@queue_argument
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
    q = open_queue(ctx, queue)
    terminal = sys.stdout.isatty()
    shown = 0
    while True:
        text = _stats_text(q, as_json, prometheus, groups)
        if prometheus and terminal:  # exact in a file or a pipe; a terminal must not act on a label
            text = terminal_text(text, multiline=True)
        if watch and shown and terminal:
            click.echo(f"\x1b[{shown}F\x1b[J", nl=False)  # back to the top of the last print
        click.echo(text, color=True if prometheus else None)  # color: click would strip "\x1b[...m" from a label
        if not watch:
            return
        shown = text.count("\n") + 1
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


@click.command()
@queue_argument
@seconds_option("--grace", 900.0, "Remove .new files older than this (publishers that died).")
@click.pass_context
def gc(ctx: click.Context, queue: str, grace: float) -> None:
    """Requeue expired messages and remove files of dead publishers, expired
    messages, stages and Spark claim manifests of jobs gone for 7 days."""
    q = open_queue(ctx, queue)
    requeued = q.requeue_expired()
    removed = q.collect_garbage(grace=grace)
    click.echo(f"requeued {requeued} expired messages, removed {removed} files "
               "(orphans, past retention, abandoned stages and Spark manifests)")


@click.command()
@queue_argument
@click.option("--to", "to", type=click.Path(file_okay=False), help="Move here instead of each message's own queue.")
@click.option("--max-messages", type=click.IntRange(min=0), default=None)
@click.pass_context
def redrive(ctx: click.Context, queue: str, to: str | None, max_messages: int | None) -> None:
    """Move messages of the dead-letter QUEUE back to their queues (count reset)."""
    q = open_queue(ctx, queue)
    target = open_queue(ctx, to) if to else None
    click.echo(f"redrove {q.redrive(target, max_messages=max_messages)} messages")


@click.command()
@queue_argument
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def purge(ctx: click.Context, queue: str, yes: bool) -> None:
    """Delete every message in QUEUE, in flight and delayed included."""
    q = open_queue(ctx, queue)
    if not yes:
        click.confirm(f"Delete every message in {terminal_text(q.path)}?", abort=True, err=True)
    click.echo(f"purged {q.purge()} messages")


def _operations_flags(command: Any) -> Any:
    for op in reversed(_settings.OPERATIONS):
        command = click.option(f"--{op}", "operations", flag_value=op, multiple=True,
                               help=f"Only {op}.")(command)
    return command


@click.command()
@queue_argument
@_operations_flags
@click.pass_context
def suspend(ctx: click.Context, queue: str, operations: tuple[str, ...]) -> None:
    """Suspend publish, receive and/or delete on QUEUE for every process (all if none given)."""
    q = open_queue(ctx, queue)
    q.suspend(*operations)
    click.echo(terminal_text("suspended: " + ", ".join(q.settings["suspended"])))


@click.command()
@queue_argument
@_operations_flags
@click.pass_context
def resume(ctx: click.Context, queue: str, operations: tuple[str, ...]) -> None:
    """Resume suspended operations on QUEUE (all if none given)."""
    q = open_queue(ctx, queue)
    q.resume(*operations)
    click.echo(terminal_text("suspended: " + (", ".join(q.settings["suspended"]) or "nothing")))


@click.command("check-fs")
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
    from vsqs._cli.checkfs import run_checks  # multiprocessing and friends: only for this command

    failed = False
    for check in run_checks(directory, other, processes, rounds):
        click.echo(terminal_text(f"{check.status:<5} {check.name:<20} {check.detail}"))
        failed = failed or check.status == "FAIL"
    if failed:
        raise SystemExit(1)


COMMANDS = (stats, gc, redrive, purge, suspend, resume, check_fs)
