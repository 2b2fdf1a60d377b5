"""gateway tests."""
