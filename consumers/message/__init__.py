"""A delivery and its fate: the decoded envelope, what a handler raises, the framework's verdict.

Internal: the public names are imported by `consumers`."""
