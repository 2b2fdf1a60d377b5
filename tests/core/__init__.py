"""core tests."""
