"""`serve` with the bench's baseline mounted: POST /bench/trivial, the same server, no database.

    python -m proving.bench.ingress_serve [serve's flags]

The product has no such endpoint; `proving.bench.ingress` starts this
instead of `idempotent-workers serve`, so the trivial endpoint runs in the
same process, framework and middleware as the send route it is compared with.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fastapi import Request, Response

from consumers import Settings
from ingress.api import create_app
from ingress.serve import run, serve, serve_settings

TRIVIAL_ANSWER = b'{"status":"queued","id":"trivial"}'


async def trivial(request: Request) -> Response:
    """The bench's baseline: read the body, answer 202, touch no database."""
    await request.body()
    return Response(TRIVIAL_ANSWER, 202, media_type="application/json")


def main(argv: Sequence[str] | None = None) -> int:
    ingress = serve_settings(
        sys.argv[1:] if argv is None else argv, prog="python -m proving.bench.ingress_serve"
    )
    app = create_app(ingress, Settings.from_env().database)
    app.add_api_route(
        "/bench/trivial", trivial, methods=["POST"], status_code=202, include_in_schema=False
    )
    return run(serve(ingress, app))


if __name__ == "__main__":
    sys.exit(main())
