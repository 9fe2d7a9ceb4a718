"""Where the metrics endpoint listens: loopback unless told otherwise.

`/metrics`, `/healthz` and `/readyz` have no authentication, so by default
a worker's endpoint listens on 127.0.0.1 only; `IW_METRICS_HOST=0.0.0.0`
opens it to every address (what deploy/ sets, where a scraper or a kubelet
probe comes from outside the container). The kernel's own table of
listening sockets says where a real worker process listens.
"""

from __future__ import annotations

import itertools
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


def outside_addresses() -> list[str]:
    """This machine's own IPv4 addresses that are not loopback (the kernel's local routes)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    local = {
        before.split()[-1]
        for before, line in itertools.pairwise(lines)
        if line.strip() == "/32 host LOCAL"
    }
    return sorted(a for a in local if not a.startswith("127."))


def connects(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=5):
            return True
    except OSError:
        return False


async def test_the_metrics_endpoint_listens_on_loopback_only_by_default(
    db: DbConnection, spawn: Spawn
) -> None:
    worker = spawn({"IW_METRICS_PORT": "0"})
    base = await worker.endpoint()
    port = int(base.rsplit(":", 1)[1])
    assert listening_on(port) == {"127.0.0.1"}
    status, _ = await http_get(f"{base}/healthz")
    assert status == 200
    for address in outside_addresses():  # 192.0.2.2 on the machine this was written on
        assert not connects(address, port), address


async def test_metrics_host_0_0_0_0_listens_on_every_address(
    db: DbConnection, spawn: Spawn
) -> None:
    worker = spawn({"IW_METRICS_PORT": "0", "IW_METRICS_HOST": "0.0.0.0"})
    base = await worker.endpoint()
    port = int(base.rsplit(":", 1)[1])
    assert listening_on(port) == {"0.0.0.0"}
    for address in outside_addresses():
        assert connects(address, port), address
