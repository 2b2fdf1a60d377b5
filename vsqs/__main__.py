"""``python -m vsqs``: the same as the ``vsqs`` command."""

from vsqs._cli import main

main(prog_name="vsqs")
