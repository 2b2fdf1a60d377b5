"""The Spark data source and helpers (an adapter over the public API)."""
