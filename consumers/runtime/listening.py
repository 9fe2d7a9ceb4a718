"""A server socket that accepts connections before its server has started.

`serve` and `console` bind their own socket (port 0: any free port), print the
port for a parent process to read, then hand the socket to uvicorn. uvicorn
only calls `listen()` once it has started, so a connect made on the printed
line could be refused on a busy machine. This socket listens already: such a
connect waits in the backlog until uvicorn accepts it.
"""

from __future__ import annotations

import socket

BACKLOG = 2048  # uvicorn's `backlog` setting, which listens on it again: the same


def listening_socket(host: str, port: int, *, backlog: int = BACKLOG) -> socket.socket:
    """A TCP socket bound to (host, port), SO_REUSEADDR, listening; closed if that fails."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
