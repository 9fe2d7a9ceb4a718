"""The sending side: the Publisher (confirms; unroutable is an error) and the outbox relay.

Internal: the public names are imported by `consumers`."""
