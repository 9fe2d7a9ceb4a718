"""Under everything AMQP: the connection over several addresses, the queues declared,
what a header may carry.

Internal: the public names are imported by `consumers`."""
