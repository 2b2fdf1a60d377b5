"""``vsqs serve``: the spool over HTTP, natively and in the Amazon SQS protocol (an adapter)."""
