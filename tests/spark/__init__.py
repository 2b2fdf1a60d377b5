"""spark tests."""
