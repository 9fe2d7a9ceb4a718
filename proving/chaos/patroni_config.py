"""One Patroni node's configuration (proving.chaos.patroni): short DCS timings, trust on loopback.

ttl 10 s and loop_wait 1 s: a dead leader's key expires within 10 s, so a
primary kill costs about that much. `synchronous_mode` follows the cluster
(the control run turns it off and sets `synchronous_commit = local`).
pg_rewind brings a killed primary back as a replica; a rewind that fails
removes the data directory and Patroni clones it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proving.chaos.services import PG_BIN


def patroni_config(
    *,
    name: str,
    base: Path,
    port: int,
    api_port: int,
    scope: str,
    etcd_port: int,
    synchronous: bool,
) -> dict[str, Any]:
    """The node's patroni.yml, as a mapping (written as JSON, which is YAML)."""
    hba = [
        "local all all trust",
        "host all all 127.0.0.1/32 trust",
        "host replication all 127.0.0.1/32 trust",
    ]
    config: dict[str, Any] = {
        "scope": scope,
        "namespace": "/iw/",
        "name": name,
        "log": {"level": "WARNING"},
        "restapi": {
            "listen": f"127.0.0.1:{api_port}",
            "connect_address": f"127.0.0.1:{api_port}",
        },
        "etcd3": {"hosts": f"127.0.0.1:{etcd_port}"},
        "bootstrap": {
            "dcs": {
                "ttl": 10,
                "loop_wait": 1,
                "retry_timeout": 4,
                "maximum_lag_on_failover": 16 * 1024 * 1024,
                "synchronous_mode": synchronous,
                "postgresql": {
                    "use_pg_rewind": True,
                    "remove_data_directory_on_rewind_failure": True,
                    "remove_data_directory_on_diverged_timelines": True,
                    "parameters": {
                        "max_connections": 200,
                        "shared_buffers": "64MB",
                        "wal_log_hints": "on",
                        "wal_keep_size": "256MB",
                        # The control (not synchronous): commits wait for no standby.
                        **({} if synchronous else {"synchronous_commit": "local"}),
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, "no-sync"],
            "pg_hba": hba,
        },
        "postgresql": {
            "listen": f"127.0.0.1:{port}",
            "connect_address": f"127.0.0.1:{port}",
            "data_dir": str(base / "data"),
            "bin_dir": str(PG_BIN),
            "pgpass": str(base / "pgpass"),
            "pg_hba": hba,
            "authentication": {
                "superuser": {"username": "postgres", "password": "x"},
                "replication": {"username": "postgres", "password": "x"},
                "rewind": {"username": "postgres", "password": "x"},
            },
            "parameters": {
                "unix_socket_directories": str(base / "sockets"),
                "log_min_messages": "warning",
            },
        },
    }
    return config
