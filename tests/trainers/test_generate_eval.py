"""`--predict_with_generate`'s eval_acc stops an answer where the inference engine does."""
import torch

from swift.model import load_model
from swift.template import get_template
from swift.trainers.generate_eval import exact_match_accuracy


def test_an_answer_ends_at_the_templates_end_of_turn_token_when_eos_is_another():
    """A model trained on chatml answers "2<|im_end|>" and would go on ("333..."); its tokenizer's
    EOS is <|endoftext|>. Before 2026-11-29 generation stopped at the tokenizer's EOS only, so the
    answer read "2333..." and scored 0."""
    model, tokenizer, _ = load_model("builtin:tiny-chat")
    tokenizer.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    two, three = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in ("2", "3"))
    script = [two, tokenizer.convert_tokens_to_ids("<|im_end|>")]  # then "3" for ever
    head, calls = model.lm_head.forward, []

    def scripted(hidden):
        logits = head(hidden)
        token = script[len(calls)] if len(calls) < len(script) else three
        calls.append(token)
        logits[..., token] = logits.max() + 100.0
        return logits

    model.lm_head.forward = scripted
    rows = [{"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]}]
    with torch.no_grad():
        assert exact_match_accuracy(model, get_template("chatml", tokenizer), rows, max_new_tokens=6) == 1.0
