"""One RePULSe proposal step on fixed negatives, on one rank or under torchrun on two (each rank
half the prompts), through the trainer's own `proposal_step`: tests/pipelines/test_two_ranks.py
compares the proposal's weights after it. Each prompt's N proposal samples are drawn alone from a
seed of its own, so both layouts step on the same samples.

    python tests/pipelines/proposal_ranks.py OUT          (or under torchrun --nproc_per_node 2)"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

PROMPTS = 4


def main(out: str) -> None:
    from swift.trainers.harmless import Negatives
    from tests.rlhf.test_harmless import N, build, perturb

    world = int(os.environ.get("WORLD_SIZE", "1"))
    # AdamW with eps 1: its first step is about lr·g/(|g| + 1), linear in small gradients (with the
    # default eps, g/|g| turns the rounding of near-zero gradients into whole steps)
    trainer = build(out, "--tuner_type", "full", "--target_dist_beta", "-2", "--actor_learning_rate", "1",
                    "--adam_epsilon", "1", "--per_device_train_batch_size", str(PROMPTS * N // world),
                    "--max_grad_norm", "0")
    rank = trainer.args.process_index
    assert trainer.args.world_size == world
    perturb(trainer.proposal.module, 2)  # q ≠ pθ, the same on every rank
    prompts = [trainer.train_dataset[i] for i in range(PROMPTS)]
    share = PROMPTS // world
    parts = []
    for i in range(rank * share, (rank + 1) * share):
        torch.manual_seed(100 + i)
        parts.append(trainer.rollout.negatives([prompts[i]]))
    neg = Negatives(prompts=[p for x in parts for p in x.prompts],
                    trajectories=[t for x in parts for t in x.trajectories],
                    rewards=torch.cat([x.rewards for x in parts]), phi=torch.cat([x.phi for x in parts]),
                    chunks=[c for x in parts for c in x.chunks])
    trainer.proposal_step(neg)
    weights = {n: p.detach().contiguous() for n, p in trainer.proposal.named}
    save_file(weights, os.path.join(out, f"proposal-rank{rank}.safetensors"))
    with open(os.path.join(out, f"proposal_step-rank{rank}.json"), "w") as f:
        json.dump({"loss/proposal": trainer._metrics["train"]["loss/proposal"][-1],
                   "rewards": [float(r) for r in neg.rewards]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
