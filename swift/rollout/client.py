"""The trainer's side of a `swift rollout` server: rollouts over HTTP, weights over a
torch.distributed group (see `swift.rollout.weight_sync`).

Every HTTP call and every collective has a timeout; a dead or unreachable server raises a
`SwiftError` naming it, so a training run ends with one line instead of hanging."""
from __future__ import annotations

import socket
import time
from dataclasses import asdict, fields

import requests
import torch

from swift.serving.guard import api_key_from_env
from swift.infer.protocol import RequestConfig
from swift.rollout.multi_turn import RolloutInferRequest
from swift.rollout.runner import Trajectory
from swift.rollout.weight_sync import WeightGroup, plan_buckets
from swift.utils.checksum import checksum
from swift.utils.logging import get_logger
from swift.utils.network import free_port
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
TRAJECTORY_FIELDS = {f.name for f in fields(Trajectory)}


def _local_address(server_host: str) -> str:
    """The address of this machine as the server sees it."""
    if server_host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((server_host, 1))  # no packet is sent; this only picks the outgoing interface
        return s.getsockname()[0]


def sync_state_dict(model, dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
    """The weights a server loads: Hugging Face names, LoRA merged; a tied output embedding is sent
    too (vLLM's in-place reload does not re-tie it)."""
    from swift.infer.vllm_engine import hf_state_dict

    named = hf_state_dict(model)
    if dtype is not None:
        named = [(n, t.to(dtype)) for n, t in named]
    return named


class RolloutClient:
    """Generates through a rollout server and pushes weights to it. Duck-types the parts of an
    InferEngine a trainer uses: `rollout`, `sync_weights`, `close`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, *, timeout: float = 240.0,
                 bucket_mb: float = 64.0, connect_timeout: float | None = None, api_key: str | None = None):
        self.host, self.port, self.timeout, self.bucket_mb = host, port, timeout, bucket_mb
        self.url = f"http://{host}:{port}"
        self.session = requests.Session()
        api_key = api_key or api_key_from_env()  # without a key given, SWIFT_API_KEY (as the servers read it)
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.group: WeightGroup | None = None
        self.wait_healthy(timeout if connect_timeout is None else connect_timeout)
        self.info = self._post("/get_engine_type/", {})
        self.world_size = self._get("/get_world_size/")["world_size"]
        logger.info(f"rollout server {self.url}: {self.info['engine_type']} x {self.world_size}")

    # -- HTTP --------------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        try:
            response = self.session.request(method, self.url + path, json=body, timeout=timeout or self.timeout)
        except requests.RequestException as e:
            raise SwiftError(f"rollout server {self.url} did not answer {path}: {type(e).__name__}") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except Exception:
                message = response.text[:200]
            raise SwiftError(f"rollout server {self.url}{path} answered {response.status_code}: {message}")
        return response.json()

    def _get(self, path: str):
        return self._call("GET", path)

    def _post(self, path: str, body: dict | None = None, timeout: float | None = None):
        return self._call("POST", path, body or {}, timeout)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if self.session.get(self.url + "/health/", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise SwiftError(f"rollout server {self.url} is not reachable (waited {timeout:.0f}s); start it with "
                                 f"`swift rollout --model ... --port {self.port}`")
            time.sleep(0.5)

    # -- generation --------------------------------------------------------------------------------
    def rollout(self, requests_: list[RolloutInferRequest], config: RequestConfig, n: int, *,
                max_completion_length: int | None = None) -> list[Trajectory]:
        """n trajectories per request, request-major (the server runs any multi-turn scheduler)."""
        config_body = {k: v for k, v in asdict(config).items() if k != "n"}
        config_body["n"] = n
        body = {"infer_requests": [{"messages": r.messages, "data_dict": r.data_dict,
                                    "rollout_infos": r.rollout_infos} for r in requests_],
                "request_config": config_body, "max_completion_length": max_completion_length}
        outputs = self._post("/infer/", body)
        trajectories = []
        for output in outputs:
            for choice in output["choices"]:
                t = Trajectory(**{k: v for k, v in choice.items() if k in TRAJECTORY_FIELDS})
                if t.logprobs is not None:
                    t.logprobs = [float("nan") if x is None else x for x in t.logprobs]
                trajectories.append(t)
        return trajectories

    # -- weight sync -------------------------------------------------------------------------------
    def init_communicator(self) -> None:
        host, port = _local_address(self.host), free_port()
        world = self.world_size + 1
        answer = self._post("/init_communicator/", {"host": host, "port": port, "world_size": world,
                                                    "timeout": self.timeout})
        # every later weight-sync call proves this trainer holds the communicator
        self.session.headers["X-Session-Token"] = answer["session_token"]
        device = "cuda" if self.info.get("cuda") and torch.cuda.is_available() else "cpu"
        self.group = WeightGroup(host, port, world - 1, world, self.timeout, device)

    def sync_weights(self, model, buckets=None) -> None:
        """Send every weight (LoRA merged, in the server's dtype) in buckets; after each bucket every
        worker reports the checksum of what its engine now holds, which must equal ours. `buckets`
        (lists of (name, tensor), e.g. gathered from ZeRO-3 partitions) are sent instead of `model`'s."""
        if self.group is None:
            self.init_communicator()
        dtype = getattr(torch, self.info.get("dtype", ""), None)
        if buckets is None:
            self._send(sync_state_dict(model, dtype))
        else:
            for named in buckets:
                self._send([(n, t.to(dtype)) for n, t in named] if dtype is not None else named)
        self._post("/reset_prefix_cache/")

    def _send(self, named: list[tuple[str, torch.Tensor]]) -> None:
        start = 0
        for metas in plan_buckets(named, self.bucket_mb):
            tensors = [t for _, t in named[start:start + len(metas)]]
            start += len(metas)
            self._post("/update_flattened_params/", {"metadatas": metas})
            flat = torch.cat([t.reshape(-1) for t in tensors]).to(self.group.device)
            try:
                self.group.broadcast(flat)
                mine = checksum(tensors)
                theirs = self.group.gather_checksums(mine)[:-1]
            except SwiftError as e:
                self.group = None
                raise SwiftError(f"rollout server {self.url}: {e}") from None
            bad = [rank for rank, value in enumerate(theirs) if value != mine]
            if bad:  # the sync is abandoned: the server, left with a mix of weights, stops generating
                self.close()
                raise SwiftError(f"rollout server {self.url}: weight sync checksum mismatch on worker(s) {bad} for "
                                 f"{metas[0]['name']} .. {metas[-1]['name']}")

    def close(self) -> None:
        if self.group is not None:
            try:
                self._post("/close_communicator/", timeout=30)
            except SwiftError as e:
                logger.warning(str(e))
            self.group.close()
            self.group = None
            self.session.headers.pop("X-Session-Token", None)
