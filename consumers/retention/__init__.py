"""How long claims must live (the retry horizon) and the cleaner that deletes older ones.

Internal: the public names are imported by `consumers`."""
