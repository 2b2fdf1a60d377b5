"""Commands on a queue itself: ``create`` and ``config``."""

from __future__ import annotations

import json
from typing import Any

import click

from vsqs import Queue
from vsqs._cli.options import open_queue, queue_argument
from vsqs._cli.text import terminal_text
from vsqs._core import settings as _settings


def _setting_options(command: Any) -> Any:
    """One --option per queue setting, e.g. --visibility-timeout, --max-receives."""
    for key in reversed(sorted(_settings.SCHEMA)):
        command = click.option(
            "--" + key.replace("_", "-"), key, default=None, metavar="VALUE",
            help=f"Set {key} ('none' unsets)."
        )(command)
    return command


@click.command()
@queue_argument
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


@click.command()
@queue_argument
@click.argument("assignments", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@click.pass_context
def config(ctx: click.Context, queue: str, assignments: tuple[str, ...], as_json: bool) -> None:
    """Show QUEUE's settings, or change them: vsqs config jobs max_receives=5 delay=none"""
    q = open_queue(ctx, queue)
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
            click.echo(f"{key:<19} {terminal_text(_settings.SCHEMA[key].text(settings[key]))}")  # read from the spool


COMMANDS = (create, config)
