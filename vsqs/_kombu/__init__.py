"""The parts of the vsqs:// kombu transport, whose public face is :mod:`vsqs.kombu`."""
