"""Logs, Prometheus metrics, health, the port that serves them, and the line of a failed start.

Internal: the public names are imported by `consumers`."""
