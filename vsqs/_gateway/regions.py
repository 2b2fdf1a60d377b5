"""Regions of the SQS face: the region name rule, and ``--region-spool REGION=DIR``.

A gateway serves its home region (``--region``) from its spool. Each
``--region-spool REGION=DIR`` serves REGION from the spool at DIR, a
directory of its own: queues of one name in two regions are two queues.
With no ``--region-spool`` every region is the home region, whatever a
client names (the gateway of one region it always was).

A region name comes from a client (a queue URL's path, an ARN, a signature's
credential scope) or from the command line; it is checked by
:func:`is_region` before it is used, and it is never a path: the spool of a
region is the directory its ``--region-spool`` gave, looked up by name.
"""

from __future__ import annotations

import re

MAX_REGION = 32  # Amazon's longest is 14 (ap-southeast-1), GovCloud's 13 (us-gov-west-1)
# Amazon's region names: a two-letter prefix, words, a number (us-east-1, ap-southeast-2, us-gov-west-1)
REGION_RULE = r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}"
_REGION_RE = re.compile(REGION_RULE)


def is_region(text: object) -> bool:
    """Whether ``text`` is a region name (Amazon's form, at most MAX_REGION characters)."""
    return isinstance(text, str) and len(text) <= MAX_REGION and _REGION_RE.fullmatch(text) is not None


def check_region(text: str) -> str:
    """``text`` if it is a region name; ValueError naming the rule if not."""
    if not is_region(text):
        raise ValueError(f"{text[:MAX_REGION + 8]!r} is not a region name (such as us-west-2: "
                         f"letters and dashes ending in a number, at most {MAX_REGION} characters)")
    return text


def region_spool(value: str) -> tuple[str, str]:
    """``REGION=DIR`` of ``--region-spool``: (region, directory); ValueError if malformed."""
    region, sep, directory = value.partition("=")
    if not sep or not directory:
        raise ValueError(f"{value[:80]!r}: give REGION=DIR, such as eu-west-1=/srv/vsqs/eu-west-1")
    return check_region(region.strip()), directory
