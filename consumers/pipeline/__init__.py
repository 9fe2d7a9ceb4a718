"""One delivery from the batch loop to its ack: decode, claim, effects, commit, settle, ack.

Internal: the public names are imported by `consumers`."""
