"""The engine: the filesystem layer, the name grammar, the queue and its collaborators."""
