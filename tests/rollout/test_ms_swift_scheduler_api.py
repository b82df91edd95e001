"""A multi-turn scheduler written for ms-swift reads the answer as `response_choice.message.content`."""
from swift.infer.protocol import RequestConfig
from swift.rollout.multi_turn import MultiTurnScheduler, RolloutInferRequest
from swift.rollout.runner import rollout
from swift.template import get_template
from tests.rollout.test_multi_turn import ScriptedEngine


class AskAgainUnlessRight(MultiTurnScheduler):  # as ms-swift's docs write one
    def check_finished(self, infer_request, response_choice, current_turn):
        if response_choice.message.content.strip() == "52":
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        assert response_choice.message.role == "assistant"
        infer_request.messages.append({"role": "user", "content": "try again"})
        return {"infer_request": infer_request}


def test_a_scheduler_reading_message_content_runs(tokenizer):
    """Before 2026-12-07 `response_choice.message` was an AttributeError, which ended every trajectory."""
    engine = ScriptedEngine(tokenizer, ["40", "52", "99"])
    t, = rollout(engine, get_template("chatml", tokenizer), [RolloutInferRequest([{"role": "user", "content": "07+45="}])],
                 RequestConfig(max_tokens=8), 1, scheduler=AskAgainUnlessRight(max_turns=5))
    assert t.turns == 2 and t.text == "52" and "rollout_error" not in t.rollout_infos
