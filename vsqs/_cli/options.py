"""What the commands share: options with their ``VSQS_...`` environment
fallbacks, the QUEUE argument, and opening the queue a command acts on."""

from __future__ import annotations

from typing import Any

import click

from vsqs import Queue

EXIT_EMPTY = 3  # `receive` found the queue empty


def seconds_option(name: str, default: float, help: str) -> Any:
    return click.option(name, type=click.FloatRange(min=0), default=default, show_default=True, help=help)


clock_skew_option = click.option(
    "--clock-skew",
    type=click.FloatRange(0, 3600),
    default=0.0,
    envvar="VSQS_CLOCK_SKEW",
    help="Seconds of clock difference to allow between hosts sharing the spool.",
)
visibility_option = click.option(
    "--visibility-timeout",
    type=click.FloatRange(min=0),
    default=None,
    envvar="VSQS_VISIBILITY_TIMEOUT",
    help="Seconds a received message stays hidden from other consumers "
    "[default: the queue's visibility_timeout setting, 30 unless configured].",
)
queue_argument = click.argument("queue", type=click.Path(file_okay=False, path_type=str))


def open_queue(ctx: click.Context, path: str, create: bool = False) -> Queue:
    """The queue at ``path``, with the group's --clock-skew."""
    return Queue(path, create=create, clock_skew=ctx.obj["clock_skew"])

