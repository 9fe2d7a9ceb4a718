"""Push jobs: claim and lease targets, send through a provider, record answers, settle each job.

Internal: the public names are imported by `consumers`."""
