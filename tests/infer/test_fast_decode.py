"""The engine's lean decoding step gives the same tokens and log-probs as the model's own forward."""
import functools

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen3Config

from swift.infer import InferRequest, RequestConfig, TransformersEngine
from swift.infer.fast_decode import FastDecoder
from swift.template import get_template

PROMPTS = ["12+34=", "7+5=", "a longer prompt than the others, for left padding", "hi"]


def outputs(engine, config):
    requests = [InferRequest(messages=[{"role": "user", "content": p}]) for p in PROMPTS]
    return [[(c.token_ids, [lp.logprob for lp in c.logprobs]) for c in r.choices] for r in engine.infer(requests, config)]


def assert_same(fast, slow, config):
    got, want = outputs(fast, config), outputs(slow, config)
    for response, expected in zip(got, want):
        for (tokens, logprobs), (tokens_ref, logprobs_ref) in zip(response, expected):
            assert tokens == tokens_ref
            assert max((abs(a - b) for a, b in zip(logprobs, logprobs_ref)), default=0) < 1e-4


CONFIGS = [RequestConfig(max_tokens=24, temperature=0, n=2, logprobs=True),
           RequestConfig(max_tokens=300, temperature=1.0, n=3, seed=7, logprobs=True)]  # rows end apart; cache grows


def engines(model, tokenizer):
    template = get_template("chatml", tokenizer)
    return (TransformersEngine(model, tokenizer, template),
            TransformersEngine(model, tokenizer, template, fast_decode=False))


def test_tiny_model_matches_the_model_forward_and_follows_weight_updates(tiny):
    model, tokenizer, _ = tiny
    fast, slow = engines(model, tokenizer)
    for config in CONFIGS:
        assert_same(fast, slow, config)
    assert fast._fast is not None and fast._fast_verified
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # an in-place update such as a fused optimizer's
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        assert_same(fast, slow, CONFIGS[0])
    finally:
        model.load_state_dict(original)
    fast.close()
    slow.close()


def test_lora_adapter_and_base_requests_match(tiny):
    model, tokenizer, _ = tiny
    peft = get_peft_model(AutoModelForCausalLM.from_config(model.config), LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    fast, slow = engines(peft.eval(), tokenizer)
    fast.default_adapter = slow.default_adapter = "default"
    assert_same(fast, slow, CONFIGS[0])
    fast.default_adapter = slow.default_adapter = None  # adapter disabled: the base weights
    assert_same(fast, slow, CONFIGS[0])
    fast.close()
    slow.close()


@pytest.mark.parametrize("config_class,extra", [
    (LlamaConfig, {"attention_bias": True, "mlp_bias": True}),
    (MistralConfig, {"sliding_window": None}),
    (Qwen3Config, {}),  # per-head q/k norms
])
def test_other_llama_family_models_match(tiny, config_class, extra):
    _, tokenizer, _ = tiny
    config = config_class(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert FastDecoder.build(model) is not None
    fast, slow = engines(model, tokenizer)
    assert_same(fast, slow, CONFIGS[0])
    assert fast._fast_verified
    fast.close()
    slow.close()


def test_uncovered_models_and_a_wrong_fast_path_fall_back(tiny, monkeypatch):
    _, tokenizer, _ = tiny
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    assert FastDecoder.build(gpt2) is None
    model, _, _ = tiny
    real_step = FastDecoder.step
    monkeypatch.setattr(FastDecoder, "step", lambda self, tokens, positions: real_step(self, tokens, positions) + 0.5)
    fast, slow = engines(model, tokenizer)
    assert_same(fast, slow, CONFIGS[0])  # the first steps disagreed, so the model's forward was used throughout
    assert fast._fast is None
    fast.close()
    slow.close()


def test_rows_that_join_and_leave_mid_decode_match_the_model_forward(tiny, monkeypatch):
    """FastDecoder on its own: A decodes alone; B joins with a prompt longer than A's columns (no
    padding bias yet: the running row moves right behind masked columns); C joins with a shorter
    one (right-aligned behind masked columns; the buffers grow to `max_rows`); D joins (they grow
    again); B leaves from the middle (D moves into its place: `select` returns the new order) while
    the 4 leading columns only B used stay (too few to drop); E joins into the spare row B's
    leaving freed, which still holds D's old bias and cache; A and D leave, and the columns only
    they used are dropped. At every step each row's logits equal the model's forward over that
    row's whole sequence. Uninitialised memory is NaN here, so a cache column that is read but was
    never written (masked columns still enter attention's sum, with weight 0) would show."""
    from transformers import DynamicCache

    new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: new_empty(self, *a, **k).fill_(float("nan")))
    model, _, _ = tiny
    fast = FastDecoder.build(model)
    rows: list[list[int]] = []

    def prefill(prompt: list[int]):
        cache = DynamicCache()
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
        rows.append(list(prompt))
        return cache, torch.ones_like(ids), logits

    def steps(count: int) -> None:
        for _ in range(count):
            tokens = torch.tensor([(7 * len(r) + 3 * r[0]) % 1000 + 10 for r in rows])
            positions = torch.tensor([len(r) for r in rows])
            with torch.inference_mode():
                ours = fast.step(tokens, positions)
            for row, token in zip(rows, tokens.tolist()):
                row.append(token)
            with torch.inference_mode():
                for i, row in enumerate(rows):
                    theirs = model(input_ids=torch.tensor([row])).logits[0, -1]
                    assert (ours[i] - theirs).abs().max().item() < 1e-4 * (1 + theirs.abs().max().item())

    cache, mask, _ = prefill(list(range(20, 25)))
    fast.start(cache, mask, 64)
    steps(3)
    assert fast.bias is None and fast.length == 8
    cache, mask, _ = prefill(list(range(30, 42)))  # 12 > 8 columns
    fast.join(cache, mask)
    assert fast.length == 12 and torch.isneginf(fast.bias[0, 0, 0, :4]).all()
    steps(4)
    cache, mask, _ = prefill([50, 51, 52])  # 3 < 16 columns
    fast.join(cache, mask, max_rows=3)
    assert fast.length == 16 and torch.isneginf(fast.bias[2, 0, 0, :13]).all()
    assert fast.keys[0].size(0) == 3  # twice 2 rows, but at most 3
    steps(2)
    cache, mask, _ = prefill([60, 61, 62, 63, 64, 65])
    fast.join(cache, mask)
    assert fast.keys[0].size(0) == 6 and fast.rows == 4
    steps(1)
    order = fast.select([0, 2, 3])  # B leaves; the last row (D) takes its place
    assert order == [0, 3, 2]
    rows[:] = [rows[i] for i in order]
    assert fast.length == 19  # the 4 leading columns only B used are under a quarter of 19: kept
    steps(2)
    # E: into row 3, which still holds D's old state (D's bias masks 12 columns, E needs 9 masked)
    cache, mask, _ = prefill(list(range(70, 82)))
    fast.join(cache, mask)
    assert fast.rows == 4 and fast.keys[0].size(0) == 6
    steps(2)
    order = fast.select([2, 3])  # A and D leave: C and E remain
    assert order == [2, 3]
    rows[:] = [rows[i] for i in order]
    assert fast.length == 23 - 9  # the 9 columns before E's prompt (and C's) were only A's, B's and D's
    steps(3)


def test_a_model_whose_forward_takes_no_logits_to_keep_is_served(tiny):
    """The prefill asks for the last position's logits only (`logits_to_keep=1`) where the model's
    forward takes that argument; a forward without it gets the plain call, and both decode alike."""
    model, tokenizer, _ = tiny

    class Plain(torch.nn.Module):  # a causal LM whose forward has no logits_to_keep (nor **kwargs)
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

        def get_input_embeddings(self):
            return self.inner.get_input_embeddings()

        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, use_cache=use_cache)

    template = get_template("chatml", tokenizer)
    plain = TransformersEngine(Plain(model), tokenizer, template)
    direct = TransformersEngine(model, tokenizer, template, fast_decode=False)
    try:
        assert direct._keeps_logits and not plain._keeps_logits
        assert_same(plain, direct, CONFIGS[0])
    finally:
        plain.close()
        direct.close()


@pytest.mark.parametrize("prompt_logprobs, kept", [(None, 1), (1, None)])
def test_the_prefill_projects_only_the_last_position_unless_the_prompt_is_scored(tiny, monkeypatch, prompt_logprobs,
                                                                              kept):
    """One generated token: the model's forward runs once, for the prefill, with logits_to_keep=1
    (one position's logits) or, when the prompt's log-probs are asked for, over every position."""
    model, tokenizer, _ = tiny
    calls = []
    forward = model.forward

    @functools.wraps(forward)  # the same signature, which the engine reads
    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls.append((kwargs.get("logits_to_keep"), out.logits.shape[1], kwargs["input_ids"].shape[1]))
        return out
    monkeypatch.setattr(model, "forward", spy)
    engine = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), fast_decode=False)
    try:
        engine.infer([InferRequest(messages=[{"role": "user", "content": "12+34="}])],
                     RequestConfig(max_tokens=1, temperature=0, prompt_logprobs=prompt_logprobs))
    finally:
        engine.close()
    [(keep, positions, width)] = calls
    assert keep == kept and positions == (1 if kept else width) and width > 1
