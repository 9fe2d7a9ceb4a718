"""`idempotent-workers bench --scale`: one and two framework processes beside bare ones.

On the services of AMQP_URL and DATABASE_URL, in a schema and a queue of its
own: for each variant, pre-publish --messages jobs, then start its processes
on that one queue and time first delivery to last ack across them; variants
interleaved, --repeats runs each, medians:

    processes=1   `idempotent-workers run proving.bench.scale.app:app` (no supervisor)
    processes=2   the same with `--processes 2` (the supervisor and two children)
    bare_1        one bare aio-pika consumer process (the bench's `ceiling` loop)
    bare_2        two of them

Every process is timed by the bench's own stopwatch, installed inside it
(`proving.bench.scale.instrument`), which writes its count and its first
delivery and last ack times (CLOCK_MONOTONIC, one clock for every process on
the machine) to a file; the bench adds the files up. After each framework
run the effects table must hold exactly one row per message.

    scale: processes=1 rate=… processes=2 rate=… bare_1=… bare_2=… two/bare_1=… two/bare_2=…
"""

from proving.bench.scale.run import main, scale

__all__ = ["main", "scale"]
