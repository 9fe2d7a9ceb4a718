"""The operator's commands: dlq list/show/replay and inspect.

Internal: the public names are imported by `consumers`."""
