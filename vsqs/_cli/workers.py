"""``vsqs work``: run a command once per message, through the library's Worker."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import click

from vsqs import Message, Queue, Worker
from vsqs._cli.options import open_queue, queue_argument, seconds_option, visibility_option


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


@click.command(context_settings={"ignore_unknown_options": True})
@queue_argument
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@visibility_option
@seconds_option("--wait", 5.0, "Seconds each receive long-polls before trying again (or stopping, with --burst).")
@seconds_option("--retry-delay", 0.0, "Seconds a failed message stays hidden before its retry.")
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
    q = open_queue(ctx, queue)
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


COMMANDS = (work,)
