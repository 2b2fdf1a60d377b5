"""The ``vsqs`` command group: its global options, the commands of this
package, the commands other packages add (entry-point group
``vsqs.commands``, e.g. ``serve`` from the gateway), and the one place where
a vsqs error becomes one line on stderr (what it quotes rendered safe for a
terminal by ``text.terminal_text``, as every human-readable output is).

Exit status: 0 success, 1 a vsqs error (one line on stderr), 2 bad usage,
3 ``receive`` found the queue empty.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import click

from vsqs import VsqsError, __version__
from vsqs._cli import messages, ops, queues, workers
from vsqs._cli.options import clock_skew_option
from vsqs._cli.text import TerminalLastResort, terminal_text

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

PLUGIN_GROUP = "vsqs.commands"


def plugin_entry_points() -> dict[str, EntryPoint]:
    """The commands other packages add, by name. Read only for a name that is
    not built in and for the list in --help: the plugins load lazily."""
    from importlib.metadata import entry_points  # about 10 ms: not for the built-in commands

    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def _error(ctx: click.Context, message: str) -> None:
    click.echo(f"vsqs: error: {terminal_text(message)}", err=True)
    ctx.exit(1)


def _unloadable(name: str, reason: str) -> click.Command:
    """Stands in for a plugin command that cannot be loaded: --help lists it
    with the reason, and running it prints the reason as one line (status 1)."""

    @click.pass_context
    def fail(ctx: click.Context) -> None:
        _error(ctx, f"cannot load the command {name!r}: {reason}")

    return click.Command(
        name, callback=fail, help=f"(cannot load: {terminal_text(reason)})", add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


class VsqsGroup(click.Group):
    """Built-in commands first, then the plugins'; prints a vsqs error as one
    line on stderr, with status 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *plugin_entry_points()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry_point = plugin_entry_points().get(cmd_name)
        if entry_point is None:
            return None
        try:
            loaded = entry_point.load()
        except Exception as exc:  # whatever a broken plugin raises: one line, never a traceback
            return _unloadable(cmd_name, f"{entry_point.value}: {type(exc).__name__}: {exc}")
        if not isinstance(loaded, click.Command):
            return _unloadable(cmd_name, f"{entry_point.value} is not a click command")
        return loaded

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except VsqsError as exc:
            _error(ctx, str(exc))
        except click.ClickException as exc:  # usage errors quote arguments, which may come from data
            exc.message = terminal_text(exc.message)  # type: ignore[misc]  # click's Final, set after the fact
            raise
        except BrokenPipeError:  # `vsqs ls q | head`
            sys.stderr.close()
            ctx.exit(1)


@click.group(cls=VsqsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vsqs")
@clock_skew_option
@click.pass_context
def main(ctx: click.Context, clock_skew: float) -> None:
    """vsqs: a message queue in a directory. QUEUE is the queue's directory."""
    ctx.obj = {"clock_skew": clock_skew}
    logging.lastResort = TerminalLastResort()  # the library's warnings quote names from the spool


for _command in (*queues.COMMANDS, *messages.COMMANDS, *ops.COMMANDS, *workers.COMMANDS):
    main.add_command(_command)
