"""Methods mixed into vLLM's workers (`worker_extension_cls`) so a trainer can push weights.

Tensors travel as raw bytes with their dtype and shape (vLLM's RPC serialises plain data)."""
from __future__ import annotations


def pack(tensor) -> tuple[str, list[int], bytes]:
    import torch

    t = tensor.detach().to("cpu").contiguous()
    return str(t.dtype).removeprefix("torch."), list(t.shape), t.view(torch.uint8).numpy().tobytes()


def unpack(dtype: str, shape: list[int], data: bytes):
    import torch

    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)


class WeightSyncExtension:
    def swift_load_weights(self, names: list[str], packed: list) -> int:
        """Load HF-named tensors into the running model; return their checksum as they arrived, so
        the sender can check the transport."""
        from swift.utils.checksum import checksum

        tensors = [unpack(*p) for p in packed]
        runner = self.model_runner
        if hasattr(runner, "reload_weights"):  # vLLM >= 0.2x: in-place reload in checkpoint format
            runner.reload_weights(weights_iterator=list(zip(names, tensors)), is_checkpoint_format=True)
        else:
            runner.model.load_weights(weights=list(zip(names, tensors)))
        return checksum(tensors)
