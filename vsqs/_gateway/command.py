"""``vsqs serve``: the click command that starts the gateway.

The CLI finds it through the ``vsqs.commands`` entry-point group (see
setup.cfg), so the command line needs no import of the gateway. Importing
this module needs only click and vsqs: FastAPI and uvicorn are imported
when the command runs, and their absence is a one-line error naming the
``server`` extra.
"""

from __future__ import annotations

import configparser
import logging
import os
import re
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from vsqs import Spool, VsqsError
from vsqs._core import settings as _settings
from vsqs._gateway.config import (
    DEFAULT_MAX_BODY_BYTES,
    GatewayConfig,
    check_host_name,
)
from vsqs._gateway.limits import (
    BODY_TIMEOUT,
    CONSOLE_INTERVAL,
    GC_INTERVAL,
    HEADER_TIMEOUT,
    MAX_BODY_BYTES_CEILING,
    MAX_PURGE_INTERVAL,
    MAX_RECENTLY_DELETED,
    MAX_REQUEST_TIMEOUT,
)
from vsqs._gateway.regions import check_region, region_spool


def _read_secret_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        secret = f.readline().strip()
    if not secret:
        raise click.BadParameter(f"{path} is empty", param_hint="--api-key-file")
    return secret


def _aws_credentials(path: str | None) -> dict[str, str]:
    """Access key id -> secret, from the environment and an AWS shared-credentials
    file (every profile with aws_access_key_id and aws_secret_access_key)."""
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


def _public_hosts(given: tuple[str, ...]) -> list[str]:
    """The --public-host names and those of $VSQS_PUBLIC_HOSTS (comma or space separated), checked."""
    names = [*given, *re.split(r"[\s,]+", os.environ.get("VSQS_PUBLIC_HOSTS", ""))]
    try:
        return sorted({check_host_name(name) for name in names if name})
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--public-host") from None


def _public_url(url: str | None) -> str | None:
    """--public-url: ``http(s)://HOST[:PORT]``, nothing after (queue URLs are BASE/ACCOUNT/NAME)."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.username
            or parts.password or parts.path not in ("", "/") or parts.query or parts.fragment):
        raise click.BadParameter(f"{url!r}: give http(s)://HOST[:PORT] and nothing more", param_hint="--public-url")
    return f"{parts.scheme}://{parts.netloc}"


def _region_spools(given: tuple[str, ...], home_region: str, home_spool: str, create: bool) -> dict[str, str]:
    """The --region-spool REGION=DIR pairs, checked: region -> the absolute path of its
    spool (made if missing with --create, as SPOOL is). Each region once, none the home
    region (whose spool is SPOOL), each spool a directory of its own."""
    found: dict[str, str] = {}
    if not given:
        return found
    try:
        check_region(home_region)  # (compared with the regions requests name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--region") from None
    try:
        pairs = [region_spool(value) for value in given]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--region-spool") from None
    seen = {os.path.realpath(home_spool): f"SPOOL (region {home_region})"}
    for region, directory in pairs:
        if region == home_region:
            raise click.BadParameter(f"{region} is the home region (--region): its spool is SPOOL",
                                     param_hint="--region-spool")
        if region in found:
            raise click.BadParameter(f"{region} is given twice", param_hint="--region-spool")
        try:
            Spool(directory, create=create)
        except VsqsError as exc:  # missing without --create
            raise click.BadParameter(f"{region}: {exc}", param_hint="--region-spool") from None
        real = os.path.realpath(directory)
        if real in seen:
            raise click.BadParameter(f"{directory} is already the spool of {seen[real]}: each region needs "
                                     "a directory of its own", param_hint="--region-spool")
        # (a spool inside another would be a queue of it: deleting that queue deletes the spool)
        nested = next((other for other in seen if os.path.commonpath([other, real]) in (other, real)), None)
        if nested is not None:
            raise click.BadParameter(f"{directory} and the spool of {seen[nested]} lie one inside the other: "
                                     "each region needs a directory apart", param_hint="--region-spool")
        seen[real] = f"region {region}"
        found[region] = os.path.abspath(directory)
    return found


def _old_name_of_max_body_bytes(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """``--max-message-bytes``, the old name of ``--max-body-bytes``: taken, with a warning."""
    if value is not None:
        click.echo("vsqs serve: warning: --max-message-bytes is deprecated, use --max-body-bytes "
                   "(max_message_bytes is a queue's setting)", err=True)
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--region", default="us-east-1", show_default=True,
              help="The home region: SPOOL's, in its queue ARNs (and every region's, without --region-spool).")
@click.option("--region-spool", "region_spools", multiple=True, metavar="REGION=DIR",
              help="Serve the SQS face's requests for REGION from the spool at DIR (made with --create), "
              "its queue URLs BASE/queue/REGION/ACCOUNT/NAME. Repeatable. A request is for the region its "
              "queue URL names, else the region it is signed for if it has a spool, else the home region. "
              "The native API and the console serve SPOOL only.")
@click.option("--max-body-bytes", type=click.IntRange(1, MAX_BODY_BYTES_CEILING), default=DEFAULT_MAX_BODY_BYTES,
              show_default=True, help="Largest message body the gateway takes, and the most one SQS batch carries "
              "(a queue's own max_message_bytes may be lower).")
@click.option("--max-message-bytes", "old_max_body_bytes", type=click.IntRange(1, MAX_BODY_BYTES_CEILING),
              default=None, hidden=True, callback=_old_name_of_max_body_bytes)
@click.option("--file-mode", default=None, metavar="MODE",
              help="Octal mode for the queues the gateway creates, e.g. 660 for a group-shared spool.")
@click.option("--limit-concurrency", type=click.IntRange(1), default=None,
              help="Answer 503 past this many open connections and requests per worker [default: no limit].")
@click.option("--public-host", "public_hosts", multiple=True, metavar="NAME",
              help="A name clients reach the gateway by, beyond localhost, IP addresses and --host (a proxy's "
              "public name); requests for other Host names are refused. Repeatable [also $VSQS_PUBLIC_HOSTS].")
@click.option("--public-url", envvar="VSQS_PUBLIC_URL", default=None, metavar="URL",
              help="http(s)://HOST[:PORT] the SQS face's queue URLs start with [default: the request's own "
              "scheme and Host; also $VSQS_PUBLIC_URL].")
@click.option("--header-timeout", type=click.FloatRange(0, MAX_REQUEST_TIMEOUT, min_open=True),
              default=HEADER_TIMEOUT, show_default=True, metavar="SECONDS",
              help="Close a connection that has not sent a whole request head within this time.")
@click.option("--body-timeout", type=click.FloatRange(0, MAX_REQUEST_TIMEOUT, min_open=True),
              default=BODY_TIMEOUT, show_default=True, metavar="SECONDS",
              help="Answer 408 to a request whose body has not come in full within this time.")
@click.option("--gc-interval", type=click.FloatRange(0), default=GC_INTERVAL, show_default=True, metavar="SECONDS",
              help="Collect the spool's garbage (retention, orphaned files, spent leases) every this many seconds, "
              "one process at a time among all gateways on the spool; 0: never (leave it to `vsqs gc`).")
@click.option("--console-interval", type=click.FloatRange(0), default=CONSOLE_INTERVAL, show_default=True,
              metavar="SECONDS", help="Sample every queue's counts for the web console's charts (/ui) every this "
              "many seconds, one process at a time among all gateways on the spool; 0: no charts.")
@click.option("--sqs-recently-deleted", type=click.FloatRange(0, MAX_RECENTLY_DELETED), default=0.0,
              show_default=True, metavar="SECONDS",
              help="SQS face: refuse CreateQueue of a name deleted (by any face or host) less than SECONDS ago, "
              "with Amazon's QueueDeletedRecently (Amazon waits 60); 0: never, a name can be made again at once.")
@click.option("--sqs-purge-interval", type=click.FloatRange(0, MAX_PURGE_INTERVAL), default=0.0,
              show_default=True, metavar="SECONDS",
              help="SQS face: refuse PurgeQueue of a queue purged (by any face or host) less than SECONDS ago, "
              "with Amazon's PurgeQueueInProgress (Amazon waits 60); 0: never, a purge may follow at once.")
@click.option("--create", is_flag=True, help="Create SPOOL if it does not exist.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@click.option("--access-log", is_flag=True,
              help="Log one line per request (uvicorn's access log, at level info); off by default: it costs "
              "0.1-0.35 ms of CPU a request, and /metrics counts requests by operation and outcome.")
def serve(
    spool: str, host: str, port: int, workers: int, api_key_file: str | None, aws_credentials_file: str | None,
    region: str, region_spools: tuple[str, ...], max_body_bytes: int, old_max_body_bytes: int | None,
    file_mode: str | None,
    limit_concurrency: int | None,
    public_hosts: tuple[str, ...], public_url: str | None, header_timeout: float, body_timeout: float,
    gc_interval: float, console_interval: float, sqs_recently_deleted: float, sqs_purge_interval: float,
    create: bool, log_level: str, access_log: bool,
) -> None:
    """Serve SPOOL over HTTP: the native API under /queues and the Amazon SQS
    protocol on POST / (needs the extra: pip install 'vsqs[server]').

    The gateway keeps no state: run as many as you like, on any hosts sharing
    the spool. TLS belongs to a reverse proxy in front.
    """
    try:
        from vsqs._gateway.app import serve as run
    except ImportError as exc:
        raise click.ClickException(
            f"vsqs serve needs the server extra: pip install 'vsqs[server]' ({exc})") from None

    if old_max_body_bytes is not None:
        if click.get_current_context().get_parameter_source("max_body_bytes") is not ParameterSource.DEFAULT:
            raise click.UsageError("give --max-body-bytes only (--max-message-bytes is its old name)")
        max_body_bytes = old_max_body_bytes
    Spool(spool, create=create)  # QueueNotFound (a clear one-line error) if it is missing
    regions = _region_spools(region_spools, region, spool, create)
    api_key = _read_secret_file(api_key_file) if api_key_file else os.environ.get("VSQS_API_KEY") or None
    if file_mode is not None:
        try:
            file_mode = _settings.validate({"file_mode": file_mode})["file_mode"]
        except VsqsError as exc:
            raise click.BadParameter(str(exc), param_hint="--file-mode") from None
    config = GatewayConfig(
        spool=os.path.abspath(spool), api_key=api_key, aws_credentials=_aws_credentials(aws_credentials_file),
        region=region, region_spools=regions, max_body_bytes=max_body_bytes, file_mode=file_mode,
        listen_host=host, public_hosts=_public_hosts(public_hosts), public_url=_public_url(public_url),
        header_timeout=header_timeout, body_timeout=body_timeout, gc_interval=gc_interval,
        console_interval=console_interval, sqs_recently_deleted=sqs_recently_deleted,
        sqs_purge_interval=sqs_purge_interval,
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run(config, host=host, port=port, workers=workers, log_level=log_level, limit_concurrency=limit_concurrency,
        access_log=access_log)
