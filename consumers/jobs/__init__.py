"""What a job of each kind of external effect says, and whom it goes to.

A queue that makes external effects reads its jobs through an `EffectKind`
(`consumers.jobs.kind`): push, webhooks, e-mail, calls to an API. The runner over
the send ledger (`consumers.effects`) is the same for every kind.

Internal: the public names are imported by `consumers`."""
