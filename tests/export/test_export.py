"""`swift export`: each format is checked by the runtime it is for. The GGUF files are loaded and run
by llama.cpp (llama-cpp-python) and answer the quickstart's held-out sums as our engine does."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from fastapi import FastAPI, Request  # module level: the stand-in's handlers name Request in their annotations
from fastapi.responses import JSONResponse

from swift.utils.registry import SwiftError
from tests.conftest import SWIFT



def export(*flags: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*SWIFT, "export", *flags], capture_output=True, text=True, cwd=cwd)


def held_out():
    from swift.dataset.loader import load_rows

    return load_rows(["builtin:arith-sft:eval"]).rows


def our_answers(model_dir: str, rows) -> list[str]:
    from swift.infer.protocol import InferRequest, RequestConfig
    from swift.infer.transformers_engine import TransformersEngine
    from swift.model import load_model
    from swift.template import get_template

    model, tokenizer, _ = load_model(model_dir, torch_dtype="float32")
    engine = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer), inline=True)
    try:
        requests = [InferRequest(messages=r["messages"][:1]) for r in rows]
        out = engine.infer(requests, RequestConfig(max_tokens=8, temperature=0.0))
    finally:
        engine.close()
    return [o.choices[0].text for o in out]


def llama_answers(gguf: str, model_dir: str, rows) -> list[str]:
    """Greedy answers of llama.cpp on the prompts as the chat template renders them, tokenized by
    llama.cpp's own tokenizer from the GGUF."""
    import llama_cpp
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=256, n_threads=2, verbose=False, seed=0)
    answers = []
    for r in rows:
        prompt = tokenizer.apply_chat_template(r["messages"][:1], tokenize=False, add_generation_prompt=True)
        out = llm.create_completion(prompt, max_tokens=8, temperature=0.0, stop=["<|im_end|>"])
        answers.append(out["choices"][0]["text"])
    return answers


@pytest.fixture(scope="module")
def reference(quickstart):
    _, out = quickstart
    model_dir = os.path.join(out, "sft")
    rows = held_out()
    return model_dir, rows, our_answers(model_dir, rows)


def test_gguf_f16_and_the_modelfile_answer_as_our_engine(reference, tmp_path):
    import llama_cpp

    model_dir, rows, ours = reference
    out = tmp_path / "ollama"
    proc = export("--model", model_dir, "--to_ollama", "true", "--output_dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["Modelfile", "export_args.json", "model-f16.gguf"]
    theirs = llama_answers(str(out / "model-f16.gguf"), model_dir, rows)
    assert theirs == ours
    assert sum(a == r["solution"] for a, r in zip(ours, rows)) / len(rows) > 0.8  # a model that really adds
    # the GGUF carries the chat template (without the training-only {% generation %} tags): llama.cpp's
    # chat completion renders it itself
    llm = llama_cpp.Llama(model_path=str(out / "model-f16.gguf"), n_ctx=256, verbose=False)
    assert "endgeneration" not in llm.metadata["tokenizer.chat_template"]
    for r, expected in list(zip(rows, ours))[:20]:
        chat = llm.create_chat_completion(messages=r["messages"][:1], max_tokens=8, temperature=0.0)
        assert chat["choices"][0]["message"]["content"] == expected
    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./model-f16.gguf\nTEMPLATE \"\"\"{{ range .Messages }}")
    assert 'PARAMETER stop "<|im_end|>"' in modelfile


@pytest.mark.parametrize("gguf_type,agreement", [("q8_0", 0.99), ("q4_k_m", 0.9)])
def test_quantized_gguf_mostly_answers_as_our_engine(reference, tmp_path, gguf_type, agreement):
    model_dir, rows, ours = reference
    out = tmp_path / gguf_type
    proc = export("--model", model_dir, "--to_gguf", "true", "--gguf_type", gguf_type, "--output_dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    gguf = out / f"model-{gguf_type}.gguf"
    import gguf as gguf_py
    import llama_cpp

    reader = gguf_py.GGUFReader(str(gguf))
    file_type = int(reader.fields["general.file_type"].parts[-1][0])
    assert file_type == getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{gguf_type.upper()}")
    # every matrix is quantized: llama.cpp's k-quants need rows of 256 numbers, so on this model (rows of 128
    # and 384) its quantizer falls back to q5_0 for q4_k_m's 4-bit tensors (and q8_0 for the 6-bit ones)
    matrices = {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}
    assert matrices == ({"Q8_0"} if gguf_type == "q8_0" else {"Q5_0", "Q8_0"}), matrices
    theirs = llama_answers(str(gguf), model_dir, rows)
    same = sum(a == b for a, b in zip(theirs, ours)) / len(rows)
    assert same >= agreement, same


def test_merged_lora_equals_the_adapter_and_converts(tmp_path, tiny):
    import llama_cpp
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model, tokenizer, _ = tiny
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "lora"
    model.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    torch.manual_seed(0)  # init_lora_weights=False: B is random too, so the adapter changes the outputs
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)).save_pretrained(
        adapter_dir)
    out = tmp_path / "merged"
    proc = export("--adapters", str(adapter_dir), "--merge_lora", "true", "--to_gguf", "true",
                  "--output_dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"config.json", "model.safetensors", "tokenizer.json", "model-f16.gguf"} <= set(os.listdir(out))
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    ids = tokenizer(["12+34=46", "7+5=12"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected, got = reference(**ids).logits, merged(**ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base_dir)(**ids).logits
    assert (expected - plain).abs().max() > 1e-2
    assert (got - expected).abs().max() < 1e-4
    # llama.cpp's logits of the merged GGUF (f16 weights) follow the adapter's
    llm = llama_cpp.Llama(model_path=str(out / "model-f16.gguf"), n_ctx=64, logits_all=True, verbose=False)
    # named after the model and adapter (before 2026-11-30 every GGUF was "Runtime", the converter's scratch folder)
    assert llm.metadata["general.name"] == "base-lora"
    tokens = tokenizer("12+34=46")["input_ids"]
    llm.eval(tokens)
    theirs = torch.tensor(llm.scores[:len(tokens)])
    assert (theirs - expected[0, :len(tokens)]).abs().max() < 0.05
    assert (theirs - plain[0, :len(tokens)]).abs().max() > 0.05


def test_refusals_leave_nothing_behind(tmp_path, tiny):
    from swift.pipelines.export import export_main

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    proc = export("--model", "builtin:tiny-chat", "--to_gguf", "true", "--output_dir", str(existing))
    assert proc.returncode == 1
    assert "--output_dir" in proc.stderr.strip().splitlines()[-1] and "--exist_ok" in proc.stderr
    assert (existing / "keep.txt").read_text() == "mine"
    for flags, message in [(["--to_mcore", "true"], "Megatron"), (["--to_hf", "true"], "Megatron"),
                           (["--to_gguf", "true", "--gguf_type", "q5_0"], "--gguf_type"),
                           ([], "nothing to export"), (["--merge_lora", "true"], "--merge_lora needs --adapters"),
                           (["--quant_method", "gptq", "--quant_bits", "5"], "--quant_bits 2, 3, 4, 8"),
                           (["--merge_lora", "true", "--group_size", "64"], "--group_size is GPTQ calibration"),
                           (["--quant_method", "bnb", "--quant_bits", "4", "--dataset", "x"], "--dataset is GPTQ"),
                           (["--quant_method", "gptq", "--quant_bits", "4", "--safe_serialization", "false"],
                            "safetensors only"),
                           (["--quant_method", "gptq", "--quant_bits", "4", "--quant_n_samples", "0"],
                            "--quant_n_samples must be at least 1"),
                           (["--quant_method", "awq", "--quant_bits", "4"], "awq is not built")]:
        with pytest.raises(SwiftError, match=message):
            export_main(["--model", "builtin:tiny-chat", *flags])
    # an adapter whose base model is gone
    adapter = tmp_path / "orphan"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone"),
                                                             "peft_type": "LORA"}))
    proc = export("--adapters", str(adapter), "--merge_lora", "true", "--output_dir", str(tmp_path / "o1"))
    assert proc.returncode == 1 and "gone" in proc.stderr.strip().splitlines()[-1]
    # GPTQ calibration rows none of which can be used (no answer to encode; too short): one line naming
    # the file and its first bad row, nothing written
    bad = tmp_path / "calibration.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
                   + json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
                   + "\n")
    proc = export("--model", "builtin:tiny-chat", "--quant_method", "gptq", "--quant_bits", "4", "--dataset", str(bad),
                  "--max_length", "4", "--output_dir", str(tmp_path / "o3"))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert f"--dataset {bad}: no row is usable as GPTQ calibration data" in last and "row 1" in last, last
    assert "fewer than 10 tokens" in last and not (tmp_path / "o3").exists()
    # a tokenizer llama.cpp cannot run (a word-level vocabulary): refused, nothing written
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model, tokenizer, _ = tiny
    words = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    odd = tmp_path / "word-level"
    model.save_pretrained(odd)
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="<unk>").save_pretrained(odd)
    out = tmp_path / "o2"
    proc = export("--model", str(odd), "--to_gguf", "true", "--output_dir", str(out))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"swift export: error: --to_gguf: llama.cpp's converter failed on {odd}"), proc.stderr[-2000:]
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if ".partial-" in p]


def without(module: str, tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """`swift export --model builtin:tiny-chat FLAGS` where importing `module` fails (as if not installed)."""
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / f"{module}.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([*SWIFT, "export", "--model", "builtin:tiny-chat", *flags, "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env)


def test_without_the_extra_one_line_names_it(tmp_path):
    proc = without("llama_cpp", tmp_path, "--to_gguf", "true")
    assert proc.returncode == 1
    assert '[gguf]' in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_without_gptqmodel_one_line_names_what_to_install(tmp_path):
    proc = without("gptqmodel", tmp_path, "--quant_method", "gptq", "--quant_bits", "4")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == ("swift export: error: --quant_method gptq needs gptqmodel: pip install "
                                                    "--no-deps -r requirements/gptq.txt (the file says why not an extra)")
    assert not (tmp_path / "out").exists()


def read_modelfile(text: str):
    """(the TEMPLATE's per-role (before, after) text, its generation prompt, the block it puts first when
    no system message leads, the stop words), read back from the written Modelfile."""
    import re

    template = re.search(r'^TEMPLATE """(.*?)"""$', text, re.S | re.M)[1].replace('{{ "{{" }}', "{{")
    default = None
    lead = '{{ if or (not .Messages) (ne (index .Messages 0).Role "system") }}'
    if template.startswith(lead):
        default, template = template[len(lead):].split("{{ end }}", 1)
    assert template.startswith("{{ range .Messages }}")
    body, gen = template[len("{{ range .Messages }}"):].rsplit("{{ end }}{{ end }}", 1)
    wrappers = {role: (before, after) for role, before, after in
                re.findall(r'{{ (?:else )?if eq \.Role "(\w+)" }}(.*?){{ \.Content }}(.*?)(?={{ else if |\Z)', body, re.S)}
    stops = re.findall(r'^PARAMETER stop "(.*)"$', text, re.M)
    return wrappers, gen, default, stops


# what the TEMPLATE cannot render as each chat template does (swift.export.ollama.differences), warned at export
TOOLS, CALLS, TOOL_MESSAGES = "tool definitions (Ollama's .Tools)", "assistant tool calls", "tool messages"
THINK, SYSTEMS = "earlier assistant turns (it rewrites them, e.g. drops their <think> reasoning)", \
    "a system message after the first"
DIFFERENCES = {None: [], "qwen2_5.jinja": [TOOLS, CALLS, TOOL_MESSAGES],
               "llama3_2.jinja": [TOOLS, CALLS, TOOL_MESSAGES, SYSTEMS],
               "qwen3.jinja": [TOOLS, CALLS, TOOL_MESSAGES, THINK]}


@pytest.mark.parametrize("template", ["qwen2_5.jinja", "llama3_2.jinja", "qwen3.jinja", None])
def test_the_modelfile_template_renders_what_the_chat_template_renders(tokenizer, template):
    """The written Modelfile's TEMPLATE, read back and run as Ollama runs it (the leading block when no
    system message comes first, each message in its role's text, the generation prompt), gives the chat
    template's text for conversations with and without a system prompt, and with tool messages where it
    has a tool branch (ChatML's); what it cannot render is named (before 2026-11-30 nothing was said)."""
    import copy

    from swift.export.ollama import compose, differences, modelfile, read_wrappers

    tok = copy.deepcopy(tokenizer)
    if template:
        path = os.path.join(os.path.dirname(__file__), "..", "data", "chat_templates", template)
        tok.chat_template = open(path).read()
    text = modelfile(tok, "model-f16.gguf", ["<|im_end|>", "<｜end▁of▁sentence｜>"])
    wrappers, gen, default, stops = read_modelfile(text)
    assert set(wrappers) == {"system", "user", "assistant", *(["tool"] if template is None else [])}
    assert stops == ["<|im_end|>", "<｜end▁of▁sentence｜>"]  # as written, not \u escapes
    # Qwen2.5 and Llama 3.2 put a system block first; Qwen3 does not
    assert (default is not None) == (template in ("qwen2_5.jinja", "llama3_2.jinja"))
    conversations = [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "12+7=?"}, {"role": "assistant", "content": "19"},
         {"role": "user", "content": "and 3+4?"}],
    ]
    if "tool" in wrappers:
        tool = {"role": "tool", "content": '{"temp": "22 C"}\nsunny'}
        conversations.append([conversations[1][0], {"role": "assistant", "content": "looking"}, tool, tool,
                              {"role": "assistant", "content": "sunny"}, conversations[1][2]])
    for messages in conversations:
        expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if tok.bos_token and expected.startswith(tok.bos_token):
            expected = expected[len(tok.bos_token):]  # llama.cpp adds it, as the GGUF says
        assert compose(wrappers, gen, default, messages) == expected
    assert differences(tok, *read_wrappers(tok)) == DIFFERENCES[template]
    with pytest.raises(SwiftError, match="cannot be written as a Modelfile parameter"):
        modelfile(tok, "m.gguf", ['say "stop"'])


def test_generation_tags_become_blocks_that_render_the_same(tokenizer):
    """The GGUF's chat template loses `{% generation %}` (runtimes do not know it) but renders the same text,
    whitespace control included."""
    import copy

    from swift.pipelines.export import _generation_tags_as_blocks

    messages = [{"role": "user", "content": "12+7="}, {"role": "assistant", "content": "19"}]
    base = tokenizer.chat_template
    trimmed = base.replace("{% generation %}", "{%- generation -%}").replace("{% endgeneration %}",
                                                                              "  {%- endgeneration %}")
    for template in (base, trimmed):
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = template
        expected = tok.apply_chat_template(messages, tokenize=False)
        tok.chat_template = _generation_tags_as_blocks(template)
        assert "generation" not in tok.chat_template.replace("add_generation_prompt", "")
        assert tok.apply_chat_template(messages, tokenize=False) == expected


def test_exist_ok_replaces_an_earlier_exports_weights_and_inputs_are_never_outputs(tmp_path, tiny):
    from transformers import AutoModelForCausalLM

    from swift.pipelines.export import export_main

    model, tokenizer, _ = tiny
    src = tmp_path / "src"
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    out = tmp_path / "out"
    export_main(["--model", str(src), "--quant_method", "bnb", "--quant_bits", "8", "--output_dir", str(out)])
    (out / "notes.txt").write_text("mine")
    export_main(["--model", str(src), "--quant_method", "bnb", "--quant_bits", "4", "--max_shard_size", "500KB",
                 "--output_dir", str(out), "--exist_ok", "true"])
    files = sorted(os.listdir(out))
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files  # the int8 file is gone
    assert (out / "notes.txt").read_text() == "mine"
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert type(loaded.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p or ".scratch-" in p]
    link = tmp_path / "link"
    link.symlink_to(src)
    for output_dir, message in [(link, "overlaps the input"), (src / "inner", "overlaps the input"),
                                (tmp_path, "overlaps the input")]:
        with pytest.raises(SwiftError, match=message):
            export_main(["--model", str(src), "--to_gguf", "true", "--output_dir", str(output_dir), "--exist_ok", "true"])
    for flags, message in [(["--to_gguf", "true", "--torch_dtype", "bf16"], "--torch_dtype 'bf16' is not one of"),
                           (["--merge_lora", "false", "--quant_method", "bnb", "--quant_bits", "4", "--max_shard_size",
                             "5gigs"], "--max_shard_size '5gigs'"),
                           (["--to_gguf", "true", "--torch_dtype", "bfloat16"], "--torch_dtype shapes the HF checkpoint"),
                           (["--to_gguf", "true", "--max_shard_size", "1GB"], "--max_shard_size shapes"),
                           (["--push_to_hub", "true", "--hub_model_id", "me/x", "--exist_ok", "true"],
                            "--exist_ok is not read"),
                           (["--to_gguf", "true", "--use_hf", "true"], "--use_hf picks the hub")]:
        with pytest.raises(SwiftError, match=message):
            export_main(["--model", str(src), *flags])
    with pytest.raises(SwiftError, match="is a quantized checkpoint already"):
        export_main(["--model", str(out), "--quant_method", "bnb", "--quant_bits", "8",
                     "--output_dir", str(tmp_path / "again")])


# Loading a GPTQ checkpoint leaves the variables gptqmodel's import sets as they were (before: HF_HOME and
# three more pointed at /tmp for every process started afterwards), and LoRA on it: all-linear finds
# gptqmodel's layers and PEFT adapts them, every lora_B getting a gradient (before: PEFT found no linear
# layer and `swift sft --tuner_type lora` ended in its traceback). Prints the variables set, up_proj's type
# and the count.
GPTQ_LORA = """
import os, sys, torch
from swift import SftArguments
from swift.model import load_model
from swift.tuners import prepare_model
from swift.utils.imports import GPTQMODEL_SETS
model = load_model(sys.argv[1])[0]
caches = [k for k in GPTQMODEL_SETS if k in os.environ]
model = prepare_model(model, SftArguments(model=sys.argv[1], dataset=["builtin:arith-sft#8"]).tuner_args)
ids = torch.tensor([[1, 18, 13, 18, 31, 18, 2]])
model(input_ids=ids, labels=ids).loss.backward()
lora = [p for name, p in model.named_parameters() if "lora_B" in name and p.grad is not None and p.grad.abs().sum() > 0]
print(caches, type(model.base_model.model.model.layers[0].mlp.up_proj).__name__, len(lora))
"""


@pytest.mark.parametrize("method,bits,layer,flags", [
    ("bnb", 4, "Linear4bit", []), ("bnb", 8, "Linear8bitLt", []),
    # calibration on fewer rows than the default 256 (the test's time), smaller groups than the default 128
    ("gptq", 4, "BaseQuantLinear", ["--quant_n_samples", "64", "--group_size", "64", "--max_length", "128"])])
def test_quantized_checkpoint_loads_in_swift_infer_and_deploy(reference, tmp_path, method, bits, layer, flags):
    """A bitsandbytes or GPTQ checkpoint (transformers loads it quantized from its config): `swift infer`
    answers the held-out sums as the unquantized model mostly does, and `swift deploy` serves it to the
    openai client."""
    from openai import OpenAI

    from swift.model import load_model
    from tests.deploy.serving import deploy

    model_dir, rows, ours = reference
    out = tmp_path / f"{method}{bits}"
    work = tmp_path / "work"
    work.mkdir()
    proc = export("--model", model_dir, "--quant_method", method, "--quant_bits", str(bits), *flags,
                  "--output_dir", str(out), cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.listdir(work) == []  # gptqmodel's log files went with the scratch folder
    assert str(tmp_path) not in (out / "config.json").read_text()  # nor is its offload folder recorded
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    if method == "bnb":
        assert config[f"load_in_{bits}bit"] is True
    else:
        assert (config["quant_method"], config["bits"], config["group_size"]) == ("gptq", bits, 64)
        assert "GPTQ calibration: 64 rows" in proc.stderr
    loaded = load_model(str(out))[0]
    up_proj = loaded.model.layers[0].mlp.up_proj
    assert layer in [t.__name__ for t in type(up_proj).__mro__], type(up_proj).__mro__
    if method == "gptq":  # in a fresh process (one whose first gptqmodel import is this load)
        from swift.utils.imports import GPTQMODEL_SETS

        check = subprocess.run([sys.executable, "-c", GPTQ_LORA, str(out)], capture_output=True, text=True,
                               env={k: v for k, v in os.environ.items() if k not in GPTQMODEL_SETS})
        assert check.returncode == 0, check.stderr[-3000:]
        assert check.stdout.strip().splitlines()[-1] == "[] GPTQLoraLinear 28", check.stdout
        # and a LoRA run of `swift sft` on it saves an adapter for all 28 quantized layers
        proc = subprocess.run([*SWIFT, "sft", "--model", str(out), "--tuner_type", "lora", "--dataset",
                               "builtin:arith-sft#8", "--max_steps", "1", "--per_device_train_batch_size", "4",
                               "--save_strategy", "no", "--report_to", "none", "--add_version", "false",
                               "--output_dir", str(tmp_path / "qlora")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        from safetensors import safe_open

        with safe_open(str(tmp_path / "qlora" / "adapter_model.safetensors"), "pt") as f:
            assert len([k for k in f.keys() if "lora_B" in k]) == 28
    n = 120
    result = tmp_path / "infer.jsonl"
    proc = subprocess.run([*SWIFT, "infer", "--model", str(out), "--val_dataset", f"builtin:arith-sft:eval#{n}",
                           "--max_new_tokens", "8", "--result_path", str(result)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    unquantized = {r["messages"][0]["content"]: a for r, a in zip(rows, ours)}
    results = [json.loads(line) for line in result.read_text().splitlines()]
    assert len(results) == n
    same = sum(r["response"] == unquantized[r["messages"][0]["content"]] for r in results) / n
    assert same >= 0.95, same
    with deploy("--model", str(out), "--served_model_name", "q") as base:
        client = OpenAI(base_url=base + "/v1", api_key="-")
        reply = client.chat.completions.create(model="q", messages=results[0]["messages"], max_tokens=8,
                                               temperature=0)
    assert reply.choices[0].message.content == results[0]["response"]


def hub_stand_in(token: str):
    """A local stand-in of the Hugging Face hub's upload API (repo creation, preupload, commit with added and
    deleted files, the file listing), as huggingface_hub calls it: answers every file as a regular (inline)
    upload and keeps what it gets."""
    import base64

    app = FastAPI()
    app.state.repos, app.state.unknown = {}, []

    def authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {token}"

    @app.post("/api/repos/create")
    async def create(request: Request):
        if not authorized(request):
            return JSONResponse({"error": "Invalid credentials"}, status_code=401)
        body = await request.json()
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if repo_id in app.state.repos:
            return JSONResponse({"error": "You already created this model repo", "url": f"/{repo_id}"},
                                status_code=409)
        app.state.repos[repo_id] = {"visibility": body.get("visibility"), "files": {}, "commits": []}
        return {"url": f"{request.base_url}{repo_id}", "name": repo_id}

    @app.post("/api/models/{owner}/{name}/preupload/{revision}")
    async def preupload(owner: str, name: str, revision: str, request: Request):
        body = await request.json()
        return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                          for f in body["files"]]}

    @app.post("/api/models/{owner}/{name}/commit/{revision}")
    async def commit(owner: str, name: str, revision: str, request: Request):
        if not authorized(request):
            return JSONResponse({"error": "Invalid credentials"}, status_code=401)
        repo = app.state.repos[f"{owner}/{name}"]
        for line in (await request.body()).decode().splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                repo["commits"].append(item["value"]["summary"])
            elif item["key"] == "file":
                repo["files"][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            elif item["key"] == "deletedFile":
                del repo["files"][item["value"]["path"]]
        return {"commitUrl": f"{request.base_url}{owner}/{name}/commit/1", "commitOid": "1" * 40}

    @app.get("/api/models/{owner}/{name}/tree/{revision}")
    async def tree(owner: str, name: str, revision: str):
        files = app.state.repos[f"{owner}/{name}"]["files"]
        return [{"type": "file", "path": path, "size": len(data), "oid": "0" * 40} for path, data in files.items()]

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "HEAD"])
    async def anything_else(path: str, request: Request):
        app.state.unknown.append(f"{request.method} /{path}")
        return JSONResponse({"error": "not in the stand-in"}, status_code=404)

    return app


def test_push_to_hub_uploads_through_the_hubs_api(tmp_path, tiny):
    from swift.pipelines.export import export_main
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = tiny
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    for flags, message in [(["--push_to_hub", "true"], "needs --hub_model_id"),
                           (["--merge_lora", "false", "--to_gguf", "true", "--hub_model_id", "me/x"],
                            "--hub_model_id is read only with --push_to_hub"),
                           (["--push_to_hub", "true", "--hub_model_id", "me/x", "--output_dir", str(tmp_path / "o")],
                            "--output_dir is not read")]:
        with pytest.raises(SwiftError, match=message):
            export_main(["--model", str(model_dir), *flags])
    app = hub_stand_in(token="hf_secret")
    with serve_in_thread(app) as base:
        env = {**os.environ, "HF_ENDPOINT": base, "HF_HUB_DISABLE_XET": "1"}
        # an export, uploaded after it is written
        proc = subprocess.run([*SWIFT, "export", "--model", str(model_dir), "--quant_method", "bnb", "--quant_bits",
                               "8", "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true", "--use_hf", "true",
                               "--hub_model_id", "me/tiny-int8", "--hub_token", "hf_secret",
                               "--hub_private_repo", "true", "--commit_message", "tiny int8"],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 0, (proc.stderr[-3000:], app.state.unknown)
        repo = app.state.repos["me/tiny-int8"]
        assert repo["visibility"] == "private" and repo["commits"] == ["tiny int8"]
        written = sorted(p.name for p in (tmp_path / "out").iterdir())
        assert sorted(repo["files"]) == written and "model.safetensors" in written
        assert repo["files"]["model.safetensors"] == (tmp_path / "out" / "model.safetensors").read_bytes()
        # a sharded export into the same repo: the single file is deleted (transformers would load it before the
        # index; before 2026-11-30 it stayed), the repo's GGUF and README are not weights of a checkpoint
        repo["files"].update({"model-q4_k_m.gguf": b"gguf", "README.md": b"readme"})
        proc = subprocess.run([*SWIFT, "export", "--model", str(model_dir), "--quant_method", "bnb", "--quant_bits",
                               "8", "--max_shard_size", "300KB", "--output_dir", str(tmp_path / "sharded"),
                               "--push_to_hub", "true", "--use_hf", "true", "--hub_model_id", "me/tiny-int8",
                               "--hub_token", "hf_secret"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, (proc.stderr[-3000:], app.state.unknown)
        sharded = sorted(p.name for p in (tmp_path / "sharded").iterdir())
        assert "model.safetensors.index.json" in sharded and "model.safetensors" not in sharded
        assert sorted(repo["files"]) == sorted([*sharded, "model-q4_k_m.gguf", "README.md"])
        # a folder as it is, with a wrong token: one line, the hub's answer in it
        proc = subprocess.run([*SWIFT, "export", "--model", str(model_dir), "--push_to_hub", "true", "--use_hf",
                               "true", "--hub_model_id", "me/other", "--hub_token", "wrong"],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert "--push_to_hub: cannot upload" in last and "me/other" in last
    # the hub unreachable (ModelScope's default endpoint, no network here or a closed port): one line
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_XET": "1", "HF_HUB_ETAG_TIMEOUT": "2"}
    proc = subprocess.run([*SWIFT, "export", "--model", str(model_dir), "--push_to_hub", "true", "--use_hf", "true",
                           "--hub_model_id", "me/x", "--hub_token", "t"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "the hub may be unreachable" in proc.stderr.strip().splitlines()[-1]


def test_a_terminated_export_leaves_nothing(tmp_path):
    """SIGTERM during the conversion: the staging and scratch folders go, --output_dir never appears."""
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "swift", "export", "--model", "builtin:tiny-chat", "--to_gguf",
                             "true", "--output_dir", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120

    def converting() -> bool:  # the runtime view is made right before llama.cpp's converter starts
        return any(os.path.isdir(tmp_path / p / "runtime") for p in os.listdir(tmp_path) if ".scratch-" in p)

    while not converting():  # (a signal in the middle of importing torch would abort the process instead)
        assert proc.poll() is None and time.time() < deadline, "the export ended before it could be stopped"
        time.sleep(0.05)
    time.sleep(0.5)  # inside the conversion
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM, proc.stderr.read()[-2000:]
    assert os.listdir(tmp_path) == []


def test_a_reward_models_head_is_kept_or_refused(tmp_path, tiny_dir):
    """A reward model (a seq_cls LoRA) quantized with bnb stays a sequence classifier whose scores follow
    base + adapter (before 2026-11-30 it was loaded as a causal LM: the score head was dropped); GPTQ and
    GGUF, which would drop the head, are refused before any work."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from swift.pipelines.export import export_main

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_dir, num_labels=1)
    rm.config.pad_token_id = 0
    adapter = tmp_path / "rm-lora"
    get_peft_model(rm, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS",
                                  init_lora_weights=False)).save_pretrained(adapter)
    out = tmp_path / "rm-bnb8"
    export_main(["--model", tiny_dir, "--adapters", str(adapter), "--quant_method", "bnb", "--quant_bits", "8",
                 "--output_dir", str(out)])
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForSequenceClassification"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tokenizer(["12+34=46", "7+5=13", "1+1=2"], return_tensors="pt", padding=True)
    quantized = AutoModelForSequenceClassification.from_pretrained(out).eval()
    torch.manual_seed(0)
    base = AutoModelForSequenceClassification.from_pretrained(tiny_dir, num_labels=1)
    base.config.pad_token_id = 0
    reference = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        expected, got = reference(**ids).logits, quantized(**ids).logits
    assert got.shape == expected.shape == (3, 1)
    assert (got - expected).abs().max() < 0.05 * expected.abs().max(), (got, expected)
    for flags in (["--to_gguf", "true"], ["--quant_method", "gptq", "--quant_bits", "4"]):
        flag = flags[0] if flags[0] == "--to_gguf" else "--quant_method gptq"
        with pytest.raises(SwiftError, match=f"^{flag}: .* is a seq_cls model"):
            export_main(["--model", tiny_dir, "--adapters", str(adapter), *flags, "--output_dir", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_shard_sizes_safetensors_and_llama_cpp_checkouts_are_checked_up_front(tmp_path, tiny_dir):
    """--max_shard_size is read once into bytes (a binary unit included; before 2026-11-30 `5GiB` or `5`
    passed the check and crashed after quantizing); --safe_serialization false is refused (transformers 5
    writes safetensors only; before, it was ignored); a llama.cpp checkout without the converter's
    conversion/ package is refused naming the flag (before, the converter's failure blamed the model)."""
    from safetensors import safe_open

    from swift.arguments.export import shard_bytes
    from swift.pipelines.export import export_main
    from swift.pipelines.merge_lora import merge_lora_main

    assert [shard_bytes(s) for s in ("5GB", "500KB", "1.5GB", "2GiB", "10b")] == [5 * 10**9, 500_000, 15 * 10**8,
                                                                                   2 * 2**30, 10]
    out = tmp_path / "sharded"
    export_main(["--model", tiny_dir, "--quant_method", "bnb", "--quant_bits", "8", "--max_shard_size", "0.25MiB",
                 "--output_dir", str(out)])
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 2 and (out / "model.safetensors.index.json").is_file()
    for shard in shards:  # a tensor larger than the limit gets a shard of its own
        with safe_open(shard, "pt") as f:
            assert shard.stat().st_size <= 2**18 + 2**12 or len(list(f.keys())) == 1, shard
    old = tmp_path / "llama.cpp-old"
    old.mkdir()
    (old / "convert_hf_to_gguf.py").write_text("")
    for flags, message in [(["--max_shard_size", "5"], "--max_shard_size '5' is not a size"),
                           (["--max_shard_size", "5 GB"], "--max_shard_size '5 GB' is not a size"),
                           (["--safe_serialization", "false"], "--safe_serialization false: transformers 5 writes")]:
        with pytest.raises(SwiftError, match=f"^{message}"):
            export_main(["--model", tiny_dir, "--quant_method", "bnb", "--quant_bits", "8", *flags,
                         "--output_dir", str(tmp_path / "refused")])
    with pytest.raises(SwiftError, match=f"^--llama_cpp_dir {old}: no conversion/base.py there"):
        export_main(["--model", tiny_dir, "--to_gguf", "true", "--llama_cpp_dir", str(old),
                     "--output_dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(SwiftError, match="^--safe_serialization false: transformers 5 writes"):
        merge_lora_main(["--adapters", str(adapter), "--safe_serialization", "false",
                         "--output_dir", str(tmp_path / "merged")])


def test_a_modelscope_upload_deletes_the_repos_stale_weight_files(tmp_path, monkeypatch):
    """ModelScope's upload has no delete patterns: after the upload, the repo's weight files this upload
    does not have are deleted in a second commit (a stand-in of modelscope_hub's HubApi records the calls;
    before 2026-11-30 they stayed)."""
    from types import SimpleNamespace

    import modelscope_hub.api

    from swift.model.hub import push_to_hub

    calls = []

    class HubApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, repo_type, visibility):
            calls.append(("create", repo_id))

        def upload_folder(self, repo_id, repo_type, folder, commit_message, allow_patterns):
            calls.append(("upload", sorted(allow_patterns)))
            return {"commit_url": "url"}

        def list_repo_files(self, repo_id, repo_type):
            return [SimpleNamespace(path=p) for p in ("model.safetensors", "model-00001-of-00002.safetensors",
                                                      "model.safetensors.index.json", "q4.gguf", "README.md",
                                                      "sub/pytorch_model.bin")]

        def delete_files(self, repo_id, repo_type, paths, commit_message):
            calls.append(("delete", sorted(paths)))

    monkeypatch.setattr(modelscope_hub.api, "HubApi", HubApi)
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                 "model.safetensors.index.json", "config.json"):
        (tmp_path / name).write_text("x")
    assert push_to_hub(str(tmp_path), "me/m", use_hf=False, files=sorted(os.listdir(tmp_path))) == "url"
    # the repo's top-level weight files only: a subfolder (another quantization kept there) stays
    assert calls[-1] == ("delete", ["model.safetensors"])
    calls.clear()
    (tmp_path / "only.gguf").write_text("x")  # no weight files of a checkpoint uploaded: nothing is deleted
    push_to_hub(str(tmp_path), "me/m", use_hf=False, files=["only.gguf"])
    assert [c[0] for c in calls] == ["create", "upload"]
