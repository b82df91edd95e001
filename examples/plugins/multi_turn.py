"""A multi-turn scheduler: after each answer the user asks "Are you sure?" once; the second answer
ends the trajectory (tokens the scheduler adds carry no loss).

    swift rlhf --rlhf_type grpo --external_plugins examples/plugins/multi_turn.py \
        --multi_turn_scheduler are_you_sure --max_turns 2 ...
"""
from swift.plugin import register
from swift.rollout.multi_turn import MultiTurnScheduler


@register("multi_turn", "are_you_sure")
class AreYouSure(MultiTurnScheduler):
    def check_finished(self, infer_request, response_choice, current_turn):
        return current_turn >= 2  # asked once, whatever the first answer was (even one cut at the length limit)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": "Are you sure?"})
        return {"infer_request": infer_request}
