"""A test plugin: a multi-turn scheduler whose environment fails on every trajectory of a row whose
`solution` is odd (as a flaky environment would on some rows), and asks for one more turn otherwise."""
from swift.rollout.multi_turn import MultiTurnScheduler, multi_turns


@multi_turns.register("fails_on_odd")
class FailsOnOdd(MultiTurnScheduler):
    def check_finished(self, infer_request, response_choice, current_turn):
        if int(infer_request.data_dict["solution"]) % 2:
            raise KeyError("the environment lost its state")
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": "again"})
        return {"infer_request": infer_request}
