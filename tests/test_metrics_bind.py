"""Where the metrics endpoint listens: loopback unless told otherwise.

`/metrics`, `/healthz` and `/readyz` have no authentication, so by default
a worker's endpoint listens on 127.0.0.1 only; `IW_METRICS_HOST=0.0.0.0`
opens it to every address (what deploy/ sets, where a scraper or a kubelet
probe comes from outside the container). The kernel's own table of
listening sockets says where a real worker process listens; the tests never
connect to an address other than loopback (this workplace sends traffic to
nothing else).
"""

from __future__ import annotations

import socket
from pathlib import Path

from dedupe import DbConnection
from tests.conftest import Spawn
from tests.support import http_get

LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses the kernel has a socket listening on `port` at."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == LISTEN and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


async def test_the_metrics_endpoint_listens_on_loopback_only_by_default(
    db: DbConnection, spawn: Spawn
) -> None:
    worker = spawn({"IW_METRICS_PORT": "0"})
    base = await worker.endpoint()
    port = int(base.rsplit(":", 1)[1])
    assert listening_on(port) == {"127.0.0.1"}
    status, _ = await http_get(f"{base}/healthz")
    assert status == 200


async def test_metrics_host_0_0_0_0_listens_on_every_address(
    db: DbConnection, spawn: Spawn
) -> None:
    worker = spawn({"IW_METRICS_PORT": "0", "IW_METRICS_HOST": "0.0.0.0"})
    base = await worker.endpoint()
    port = int(base.rsplit(":", 1)[1])
    assert listening_on(port) == {"0.0.0.0"}
