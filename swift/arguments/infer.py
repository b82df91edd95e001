"""Arguments shared by the commands that generate: `swift infer` and `swift deploy`."""
from __future__ import annotations

from dataclasses import dataclass, field

from swift.utils.registry import SwiftError

BACKENDS = ("transformers", "vllm")


@dataclass
class GenerationArguments:
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "Most tokens to generate per answer (default: the rest of the model's context after the prompt)."})
    temperature: float = field(default=0.0, metadata={"help": "Sampling temperature; 0 is greedy."})
    top_k: int = field(default=0, metadata={"help": "Keep the k most likely tokens (0: all)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Penalty for tokens already present (1: none)."})
    stop_words: list[str] = field(default_factory=list, metadata={"help": "Stop generating at any of these strings."})
    logprobs: bool = field(default=False, metadata={"help": "Return the log-probability of each generated token."})
    top_logprobs: int = field(default=0, metadata={"help": "Also return this many most likely alternatives per token."})
    seed: int | None = field(default=None, metadata={"help": "Sampling seed (per request)."})

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:  # (before 2026-11-29: 1 token, silently)
            raise SwiftError(f"--max_new_tokens must be at least 1, got {self.max_new_tokens} (leave it out for the "
                             "rest of the context)")

    def request_config(self):
        from swift.infer.protocol import RequestConfig

        # unset: each request gets the rest of the context (`swift.pipelines.infer.fit_to_context`)
        return RequestConfig(max_tokens=self.max_new_tokens or 1, temperature=self.temperature, top_p=self.top_p,
                             top_k=self.top_k, repetition_penalty=self.repetition_penalty, stop=list(self.stop_words),
                             logprobs=self.logprobs, top_logprobs=self.top_logprobs, seed=self.seed)


@dataclass
class EngineArguments:
    infer_backend: str = field(default="transformers", metadata={
        "help": "Inference engine: transformers (built in; ms-swift 3.x's `pt` names it too) or vllm (the [vllm] extra)."})
    adapters: list[str] = field(default_factory=list, metadata={
        "help": "LoRA adapters: DIR (applied to every request) or name=DIR (chosen per request by its model name)."})
    max_batch_size: int = field(default=32, metadata={"help": "Most sequences decoded together."})
    vllm_gpu_memory_utilization: float | None = field(default=None, metadata={
        "help": "vLLM: fraction of GPU memory (of RAM on CPU) to reserve; default 0.9 on GPU, 0.2 on CPU."})
    vllm_max_model_len: int | None = field(default=None, metadata={"help": "vLLM: context length (default: the model's)."})
    vllm_enforce_eager: bool = field(default=False, metadata={"help": "vLLM: disable CUDA graphs."})

    def __post_init__(self) -> None:
        if self.infer_backend == "pt":  # ms-swift 3.x's name of the transformers engine
            self.infer_backend = "transformers"
        if self.infer_backend in ("sglang", "lmdeploy"):
            raise SwiftError(f"--infer_backend {self.infer_backend} is an ms-swift engine this version does not support "
                             f"(it has {', '.join(BACKENDS)})")
        if self.infer_backend not in BACKENDS:
            raise SwiftError(f"--infer_backend {self.infer_backend!r} is not one of {', '.join(BACKENDS)}")
        if self.max_batch_size < 1:
            raise SwiftError("--max_batch_size must be at least 1")

    def named_adapters(self) -> dict[str, str]:
        return named_adapters(self.adapters)


def refuse_vllm_flags(args, backend: str) -> None:
    """vLLM's own flags (`--vllm_*`) change nothing when `backend`, the engine this run builds, is another."""
    if backend != "vllm":
        import dataclasses

        read = {f.name for f in dataclasses.fields(EngineArguments) if not f.name.startswith("vllm_")}
        args.refuse_unread(("engine_args",), read, f"is read by the vllm engine only (this run uses {backend}; "
                                                   "--infer_backend vllm, or --sampler_engine vllm in swift sample)")


def named_adapters(specs: list[str], flag: str = "--adapters") -> dict[str, str]:
    """`name=path` pairs; a bare path is named after its directory."""
    import os

    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = os.path.basename(spec.rstrip("/")), spec
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise SwiftError(f"{flag} {spec}: no adapter_config.json in {path}")
        out[name] = path
    return out
