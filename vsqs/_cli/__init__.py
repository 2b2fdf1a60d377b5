"""The ``vsqs`` command line (an adapter over the public API): the group in
``group``, its commands by what they act on in ``queues``, ``messages``,
``ops`` and ``workers``, what they share in ``options``; ``checkfs`` is the
filesystem checker behind ``vsqs check-fs``."""

from vsqs._cli.group import main

__all__ = ["main"]
