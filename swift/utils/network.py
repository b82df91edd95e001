"""Small networking helpers shared by the servers' clients."""
from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A port the OS has just reported free on `host` ("" = every interface); another process may
    still take it before the caller binds it."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
