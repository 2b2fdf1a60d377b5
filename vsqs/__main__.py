"""``python -m vsqs``: the same as the ``vsqs`` command."""

from vsqs._cli.commands import main

main(prog_name="vsqs")
