"""Commands other packages add through the ``vsqs.commands`` entry-point group
(``vsqs serve`` comes from the gateway this way), with fake entry points."""

from __future__ import annotations

import importlib.metadata
import os

import click
import pytest
from click.testing import CliRunner

import vsqs
import vsqs._cli.group as group
from vsqs._cli import main

NOT_A_COMMAND = "just a string"


@click.command()
@click.argument("name")
@click.option("--loud", is_flag=True, help="Shout it.")
def hello(name: str, loud: bool) -> None:
    """Greet NAME (a fake plugin command)."""
    click.echo(f"hello {name}" + ("!" if loud else ""))


@click.command()
@click.argument("path")
def opens(path: str) -> None:
    """Open the queue at PATH (a plugin that meets a vsqs error)."""
    vsqs.Queue(path)


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=group.PLUGIN_GROUP)


@pytest.fixture
def plugins(monkeypatch):
    """Replace the installed vsqs.commands entry points with the given ones."""

    def install(**values: str) -> None:
        points = {name: _entry_point(name, value) for name, value in values.items()}
        monkeypatch.setattr(group, "plugin_entry_points", lambda: points)

    return install


def invoke(*args: object) -> click.testing.Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="vsqs", catch_exceptions=False)


def test_a_plugin_command_is_listed_and_runs(plugins):
    plugins(hello=f"{__name__}:hello")
    listing = invoke("--help").output
    assert "hello" in listing and "Greet NAME" in listing
    assert "create" in listing and "work" in listing  # the built-in commands are still there
    result = invoke("hello", "world", "--loud")
    assert (result.exit_code, result.output) == (0, "hello world!\n")
    assert "Shout it." in invoke("hello", "--help").output


def test_a_plugin_that_fails_to_import_is_one_line(plugins):
    plugins(broken="tests.cli.no_such_module:serve")
    result = invoke("broken", "/spool", "--port", "1")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "vsqs: error: cannot load the command 'broken': tests.cli.no_such_module:serve: "
        "ModuleNotFoundError: No module named 'tests.cli.no_such_module'"
    ]
    listing = invoke("--help")  # the other commands stay usable, and --help says what is wrong
    assert listing.exit_code == 0 and "broken" in listing.output and "(cannot load:" in listing.output


def test_a_plugin_that_is_not_a_command_is_one_line(plugins):
    plugins(odd=f"{__name__}:NOT_A_COMMAND")
    result = invoke("odd")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"vsqs: error: cannot load the command 'odd': {__name__}:NOT_A_COMMAND is not a click command"
    ]


def test_a_vsqs_error_in_a_plugin_is_one_line(plugins, tmp_path):
    plugins(opens=f"{__name__}:opens")
    result = invoke("opens", tmp_path / "nope")
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"vsqs: error: no queue at {tmp_path / 'nope'} (create it first)"]


def test_a_built_in_command_wins_over_a_plugin_of_the_same_name(plugins, tmp_path):
    plugins(create=f"{__name__}:hello")
    assert invoke("create", tmp_path / "q").exit_code == 0
    assert os.path.isdir(tmp_path / "q")


def test_built_in_commands_do_not_read_the_entry_points(monkeypatch, tmp_path):
    def unreadable() -> dict[str, importlib.metadata.EntryPoint]:
        raise AssertionError("entry points read for a built-in command")

    monkeypatch.setattr(group, "plugin_entry_points", unreadable)
    assert invoke("create", tmp_path / "q").exit_code == 0
    assert invoke("stats", tmp_path / "q").exit_code == 0


def test_an_unknown_command_is_a_usage_error(plugins):
    plugins(hello=f"{__name__}:hello")
    result = invoke("nosuch")
    assert result.exit_code == 2 and "No such command 'nosuch'" in result.output


def test_serve_comes_from_the_installed_gateway_entry_point():
    # Passes once setup.cfg registers `serve = vsqs._gateway.command:serve` under
    # vsqs.commands and the package is installed again (pip install -e .).
    points = group.plugin_entry_points()
    assert points["serve"].value == "vsqs._gateway.command:serve"
    assert "Serve SPOOL over HTTP" in invoke("--help").output
