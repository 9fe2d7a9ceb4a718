"""What a user writes: the App, handler specs, the Context, the retry policy.

Internal: the public names are imported by `consumers`."""
