"""Logs, Prometheus metrics, health, and the port that serves them.

Internal: the public names are imported by `consumers`."""
