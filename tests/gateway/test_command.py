"""`vsqs serve`'s options become the gateway's configuration (the server itself
is replaced: these tests start nothing)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from vsqs._gateway.command import serve
from vsqs._gateway.config import DEFAULT_MAX_BODY_BYTES


@pytest.fixture
def started(monkeypatch):
    """The configurations `vsqs serve` would have started a server with."""
    pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
    configs = []
    monkeypatch.setattr("vsqs._gateway.app.serve", lambda config, **options: configs.append(config))
    return configs


def run(*args: str):
    return CliRunner().invoke(serve, list(args), catch_exceptions=False)


def test_max_body_bytes_bounds_the_gateway_body(tmp_path, started):
    result = run(str(tmp_path), "--max-body-bytes", "2048")
    assert result.exit_code == 0, result.output
    assert started[0].max_body_bytes == 2048
    assert "deprecated" not in result.output.lower()


def test_max_body_bytes_defaults_to_sqs_limit(tmp_path, started):
    assert run(str(tmp_path)).exit_code == 0
    assert started[0].max_body_bytes == DEFAULT_MAX_BODY_BYTES == 1024 * 1024


def test_max_message_bytes_still_works_with_a_deprecation_warning(tmp_path, started):
    result = run(str(tmp_path), "--max-message-bytes", "4096")
    assert result.exit_code == 0, result.output
    assert started[0].max_body_bytes == 4096
    assert "warning: --max-message-bytes is deprecated, use --max-body-bytes" in result.stderr


def test_both_names_at_once_are_refused(tmp_path, started):
    result = run(str(tmp_path), "--max-body-bytes", "2048", "--max-message-bytes", "4096")
    assert result.exit_code == 2
    assert "give --max-body-bytes only" in result.output
    assert started == []


def test_help_names_only_the_new_option():
    result = run("--help")
    assert "--max-body-bytes" in result.output
    assert "--max-message-bytes" not in result.output


def test_amazons_waits_are_off_unless_given_in_seconds(tmp_path, started):
    assert run(str(tmp_path)).exit_code == 0
    assert (started[0].sqs_recently_deleted, started[0].sqs_purge_interval) == (0, 0)
    result = run(str(tmp_path), "--sqs-recently-deleted", "60", "--sqs-purge-interval", "1.5")
    assert result.exit_code == 0, result.output
    assert (started[1].sqs_recently_deleted, started[1].sqs_purge_interval) == (60, 1.5)
    for option in ("--sqs-recently-deleted", "--sqs-purge-interval"):
        for bad in ("-1", "3601", "x"):
            assert run(str(tmp_path), option, bad).exit_code == 2
    assert len(started) == 2


def test_help_names_amazons_waits():
    result = run("--help")
    assert "--sqs-recently-deleted" in result.output and "QueueDeletedRecently" in result.output
    assert "--sqs-purge-interval" in result.output and "PurgeQueueInProgress" in result.output
