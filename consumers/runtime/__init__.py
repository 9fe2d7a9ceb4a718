"""The processes: a worker's wiring, one process until SIGTERM, the supervisor of N, the watchdog.

Internal: the public names are imported by `consumers`."""
