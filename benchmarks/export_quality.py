"""What each `swift export` format costs and keeps: held-out accuracy, perplexity, size, load time and
decoding speed of the quickstart model, each format run by the runtime it is for.

    bash examples/quickstart.sh   # writes output/quickstart/sft
    python benchmarks/export_quality.py [--model output/quickstart/sft] [--out /tmp/export-quality]

Formats: the unquantized checkpoint, bnb int8 / nf4 and GPTQ int8 / int4 checkpoints in our engine
(TransformersEngine; transformers' bitsandbytes layers and gptqmodel's GPTQ kernels on CPU), and GGUF
f16 / q8_0 / q4_k_m in llama.cpp (llama-cpp-python).
Each is written by `swift export` itself. Per format:
- accuracy: greedy exact match on the quickstart's held-out sums (all 576), and agreement with the
  unquantized model's answers;
- perplexity: exp of the mean negative log-likelihood of the answer tokens (the digits and the end of turn)
  of the held-out conversations as the chat template renders them, from the runtime's own logits (the
  questions' random operands, which no model predicts, are left out);
- size: the bytes of the weight files; load time: model construction until the first call can run;
- decode tokens/s: `--requests` prompts, one at a time, `--max_tokens` new tokens each (EOS banned
  on both sides, greedy), after `--warmup` untimed requests. One request at a time on both sides: llama.cpp's
  Python API decodes one sequence per call. Threads: torch's and llama.cpp's both set to `--threads`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import print_config  # noqa: E402


def weights_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
               if n.endswith((".safetensors", ".bin", ".gguf")) and not n.startswith("training_args"))


def export(model: str, out: str, *flags: str) -> None:
    """`swift export` into `out`, reused by a later run only when made from the same model and flags."""
    import shutil

    stamp, made_from = out + ".json", {"model": os.path.realpath(model), "flags": list(flags)}
    if os.path.isdir(out) and os.path.isfile(stamp) and json.load(open(stamp)) == made_from:
        return
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "swift", "export", "--model", model, "--output_dir", out, *flags],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    with open(stamp, "w") as f:
        json.dump(made_from, f)


class Ours:
    """An HF checkpoint (unquantized, bnb or GPTQ) in TransformersEngine."""

    def __init__(self, folder: str):
        from swift.infer import TransformersEngine
        from swift.model import load_model
        from swift.template import get_template

        start = time.perf_counter()
        self.model, self.tokenizer, _ = load_model(folder, torch_dtype="float32")
        self.engine = TransformersEngine(self.model, self.tokenizer, get_template("jinja", self.tokenizer), inline=True)
        self.load_s = time.perf_counter() - start

    def answers(self, prompts: list[list[dict]], max_tokens: int) -> list[str]:
        from swift.infer import InferRequest, RequestConfig

        out = self.engine.infer([InferRequest(messages=m) for m in prompts],
                                RequestConfig(max_tokens=max_tokens, temperature=0.0))
        return [o.choices[0].text for o in out]

    def one_at_a_time(self, prompts, max_tokens: int) -> int:
        from swift.infer import InferRequest, RequestConfig

        config = RequestConfig(max_tokens=max_tokens, temperature=0.0, logit_bias={self.tokenizer.eos_token_id: -100.0})
        return sum(len(self.engine.infer([InferRequest(messages=m)], config)[0].choices[0].token_ids) for m in prompts)

    def nll(self, texts: list[tuple[list[int], int]]) -> tuple[float, int]:
        total, count = 0.0, 0
        with torch.no_grad():
            for ids, start in texts:
                logits = self.model(torch.tensor([ids])).logits[0, start - 1:-1].float()
                total += torch.nn.functional.cross_entropy(logits, torch.tensor(ids[start:]), reduction="sum").item()
                count += len(ids) - start
        return total, count

    def close(self) -> None:
        self.engine.close()


class Llama:
    """A GGUF file in llama.cpp."""

    def __init__(self, path: str, tokenizer, threads: int):
        import llama_cpp

        start = time.perf_counter()
        self.llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, n_threads_batch=threads,
                                   logits_all=True, verbose=False, seed=0)
        self.load_s = time.perf_counter() - start
        self.tokenizer = tokenizer

    def _prompt(self, messages) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def answers(self, prompts, max_tokens: int) -> list[str]:
        return [self.llm.create_completion(self._prompt(m), max_tokens=max_tokens, temperature=0.0,
                                           stop=[self.tokenizer.eos_token])["choices"][0]["text"] for m in prompts]

    def one_at_a_time(self, prompts, max_tokens: int) -> int:
        done = 0
        for m in prompts:
            out = self.llm.create_completion(self._prompt(m), max_tokens=max_tokens, temperature=0.0,
                                             logit_bias={self.tokenizer.eos_token_id: -100.0})
            done += out["usage"]["completion_tokens"]
        return done

    def nll(self, texts: list[tuple[list[int], int]]) -> tuple[float, int]:
        total, count = 0.0, 0
        for ids, start in texts:
            self.llm.reset()
            self.llm.eval(ids)
            logits = torch.tensor(self.llm.scores[start - 1:len(ids) - 1], dtype=torch.float32)
            total += torch.nn.functional.cross_entropy(logits, torch.tensor(ids[start:]), reduction="sum").item()
            count += len(ids) - start
        return total, count

    def close(self) -> None:
        self.llm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="output/quickstart/sft")
    p.add_argument("--out", default="/tmp/export-quality")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    from swift.dataset.loader import load_rows

    rows = load_rows(["builtin:arith-sft:eval"]).rows
    prompts = [r["messages"][:1] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    texts = []  # (token ids of the conversation, where its answer starts)
    for r in rows:
        prompt = tokenizer(tokenizer.apply_chat_template(r["messages"][:1], tokenize=False,
                                                         add_generation_prompt=True))["input_ids"]
        ids = tokenizer(tokenizer.apply_chat_template(r["messages"], tokenize=False))["input_ids"]
        assert ids[:len(prompt)] == prompt
        end = ids.index(tokenizer.eos_token_id, len(prompt)) + 1  # the template's newline after it is not the answer
        texts.append((ids[:end], len(prompt)))
    speed_prompts = [[{"role": "user", "content": f"{i:02d}+{(7 * i) % 100:02d}="}] for i in range(a.requests)]
    formats = {
        "unquantized (fp32)": (a.model, None),
        "bnb int8": (os.path.join(a.out, "bnb8"), ["--quant_method", "bnb", "--quant_bits", "8"]),
        "bnb nf4": (os.path.join(a.out, "bnb4"), ["--quant_method", "bnb", "--quant_bits", "4"]),
        "GPTQ int8": (os.path.join(a.out, "gptq8"), ["--quant_method", "gptq", "--quant_bits", "8"]),
        "GPTQ int4": (os.path.join(a.out, "gptq4"), ["--quant_method", "gptq", "--quant_bits", "4"]),
        "GGUF f16": (os.path.join(a.out, "gguf-f16"), ["--to_gguf", "true", "--gguf_type", "f16"]),
        "GGUF q8_0": (os.path.join(a.out, "gguf-q8_0"), ["--to_gguf", "true", "--gguf_type", "q8_0"]),
        "GGUF q4_k_m": (os.path.join(a.out, "gguf-q4_k_m"), ["--to_gguf", "true", "--gguf_type", "q4_k_m"]),
    }
    print_config({}, {name: " ".join(flags) if flags else "the checkpoint as trained" for name, (_, flags) in formats.items()},
                 notes=[f"benchmark flags: {vars(a)}", "each format written by `swift export --model MODEL FLAGS`"])
    reference = None
    results = []
    for name, (folder, flags) in formats.items():
        if flags:
            export(a.model, folder, *flags)
        if name.startswith("GGUF"):
            gguf = next(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".gguf"))
            runner, runtime = Llama(gguf, tokenizer, a.threads), "llama.cpp"
        else:
            runner, runtime = Ours(folder), "swift (transformers)"
        answers = runner.answers(prompts, max_tokens=8)
        reference = reference or answers
        accuracy = sum(x == r["solution"] for x, r in zip(answers, rows)) / len(rows)
        agree = sum(x == y for x, y in zip(answers, reference)) / len(rows)
        total, count = runner.nll(texts)
        runner.one_at_a_time(speed_prompts[:a.warmup], a.max_tokens)
        start = time.perf_counter()
        tokens = runner.one_at_a_time(speed_prompts, a.max_tokens)
        speed = tokens / (time.perf_counter() - start)
        results.append({"format": name, "runtime": runtime, "accuracy": round(accuracy, 4), "agreement": round(agree, 4),
                        "perplexity": round(math.exp(total / count), 4), "size_mb": round(weights_bytes(folder) / 1e6, 2),
                        "load_s": round(runner.load_s, 2), "decode_tok_s": round(speed, 1)})
        runner.close()
        print(json.dumps(results[-1]), flush=True)
    print("\n| format | runtime | held-out accuracy | same answer as unquantized | perplexity | weights (MB) | "
          "load (s) | decode tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['format']} | {r['runtime']} | {r['accuracy']:.4f} | {r['agreement']:.4f} | {r['perplexity']:.4f} | "
              f"{r['size_mb']} | {r['load_s']} | {r['decode_tok_s']} |")


if __name__ == "__main__":
    main()
