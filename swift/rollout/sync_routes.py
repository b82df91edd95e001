"""The weight-sync routes of `swift rollout` (/init_communicator/, /update_*/, /reset_prefix_cache/,
/close_communicator/): the HTTP half of a sync, and who may make one. The tensors travel over the
group the holder opened (`swift.rollout.weight_sync`)."""
from __future__ import annotations

import asyncio
import ipaddress
import secrets
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request

from swift.serving.errors import RequestError
from swift.serving.guard import read_body
from swift.rollout.weight_sync import validate_metadata
from swift.utils.logging import get_logger

if TYPE_CHECKING:
    from swift.rollout.server import RolloutServer

logger = get_logger(__name__)
SESSION_HEADER = "x-session-token"


async def holder_gone(communicator: dict) -> bool:
    """A trainer that died without closing its communicator no longer listens on its store port
    (probed without blocking the event loop)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(communicator["host"], communicator["port"]), 2)
        writer.close()
        return False
    except (OSError, asyncio.TimeoutError):
        logger.warning(f"the trainer at {communicator['host']}:{communicator['port']} is gone; releasing its "
                       "weight-sync communicator")
        return True


def _same_host(a: str, b: str | None) -> bool:
    if b is None:
        return False
    try:
        x, y = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return a == b
    if x.version != y.version:  # ::ffff:1.2.3.4 is 1.2.3.4
        x = getattr(x, "ipv4_mapped", None) or x
        y = getattr(y, "ipv4_mapped", None) or y
    return x == y or (x.is_loopback and y.is_loopback)


def _communicator_request(body: dict, request: Request, server: RolloutServer, world_size: int):
    """/init_communicator/'s (host, port, timeout or None), checked (400/403 naming the field)."""
    host, port = body.get("host"), body.get("port")
    if not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise RequestError("host (string) and port (1..65535) are required", "port")
    client = request.client.host if request.client else None
    if not server.args.allow_any_store_host and not _same_host(host, client):
        raise RequestError(f"host {host!r} is not the address this request came from ({client}); the trainer "
                           "hosts the store itself (start the server with --allow_any_store_host true to allow "
                           "another address)", "host", status=403, code="store_host_not_allowed")
    if body.get("world_size") not in (None, world_size):
        raise RequestError(f"world_size must be {world_size} ({len(server.workers)} workers + the trainer), "
                           f"got {body.get('world_size')}", "world_size")
    timeout = body.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= 3600):
        raise RequestError("timeout must be a number of seconds in (0, 3600]", "timeout")
    return host, port, timeout


def _holder(server: RolloutServer, request: Request) -> None:
    """Only the trainer that opened the communicator (its session token) may use it."""
    c = server.communicator
    if c is None:
        why = f" (the last one failed: {server.sync_error})" if server.sync_error else ""
        raise RequestError(f"no communicator: call /init_communicator/ first{why}", status=409,
                           code="no_communicator")
    token = request.headers.get(SESSION_HEADER, "")
    if not secrets.compare_digest(token.encode(), c["token"].encode()):
        raise RequestError("only the trainer that opened the communicator may use it (missing or wrong "
                           "X-Session-Token)", status=403, code="not_the_holder")


def _update(server: RolloutServer, request: Request, metadatas) -> dict:
    """One bucket announced: checked against the model, then sent to every worker to receive."""
    _holder(server, request)
    if not isinstance(metadatas, list) or not all(isinstance(m, dict) for m in metadatas):
        raise RequestError("metadatas must be a list of objects", "metadatas")
    try:
        validate_metadata(metadatas, server.info["shapes"])
    except (ValueError, TypeError) as e:
        raise RequestError(str(e), "metadatas") from None
    server.weights_partial = True  # until /reset_prefix_cache/ ends the sync
    server.fire("receive", metadatas=metadatas)
    return {"message": "receiving", "numel": metadatas[-1]["end_idx"]}


def add_weight_sync_routes(app: FastAPI, server: RolloutServer) -> None:
    """/init_communicator/, /update_*/, /reset_prefix_cache/, /close_communicator/: the HTTP half of
    a weight sync (the tensors travel over the group, see `swift.rollout.weight_sync`). The trainer
    that opens the communicator gets a session token; every later weight-sync call must carry it
    in the `X-Session-Token` header."""

    @app.post("/init_communicator/")
    async def init_communicator(request: Request):
        body = await read_body(request)
        world_size = len(server.workers) + 1
        host, port, timeout = _communicator_request(body, request, server, world_size)
        async with server.communicator_lock:  # two trainers arriving together: one wins, one gets 409
            if server.communicator is not None and not await holder_gone(server.communicator):
                c = server.communicator
                raise RequestError(f"a trainer ({c['host']}:{c['port']}) already holds the weight-sync "
                                   "communicator; it must call /close_communicator/ first", status=409,
                                   code="communicator_in_use")
            token = secrets.token_urlsafe(32)
            server.communicator = {"host": host, "port": port, "token": token}
            # a sync left unfinished by the previous trainer stays abandoned until this one completes one
            server.weights_abandoned = server.weights_partial
        # capped by the server: a group that never forms gives up within --weight_sync_timeout; it forms
        # beside generation (in a thread of each worker), so until then requests are served as usual
        cap = server.args.weight_sync_timeout
        timeout = min(float(timeout or cap), cap)
        server.sync_error = None
        server.fire("init_communicator", host=host, port=port, world_size=world_size, timeout=timeout)
        return {"message": "initialising communicator", "world_size": world_size, "session_token": token,
                "timeout": timeout}

    @app.post("/update_flattened_params/")
    async def update_flattened_params(request: Request):
        body = await read_body(request)
        return _update(server, request, body.get("metadatas"))

    @app.post("/update_named_param/")
    async def update_named_param(request: Request):
        body = await read_body(request)
        shape = body.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in shape):
            raise RequestError("shape must be a list of non-negative integers", "shape")
        numel = 1
        for s in shape:
            numel *= s
        return _update(server, request, [{"name": body.get("name"), "shape": shape, "dtype": body.get("dtype"),
                                       "start_idx": 0, "end_idx": numel, "numel": numel}])

    @app.post("/reset_prefix_cache/")
    async def reset_prefix_cache(request: Request):
        _holder(server, request)
        await server.all("reset_prefix_cache")  # waits behind every bucket sent before it
        if server.communicator is None:  # a bucket failed meanwhile (its checksum, its group): not complete
            raise RequestError(f"the weight sync failed: {server.sync_error}", status=409, code="sync_failed")
        server.weights_partial, server.weights_abandoned, server.buckets_loaded = False, False, 0
        return {"success": True}

    @app.post("/close_communicator/")
    async def close_communicator(request: Request):
        _holder(server, request)
        server.communicator = None
        server.weights_abandoned = server.weights_partial  # closed mid-sync: that sync will not finish
        await server.all("close_communicator")
        return {"message": "communicator closed"}
