"""`swift <command> [flags]`: route a subcommand to its pipeline.

The only module that reads launcher environment variables: when NPROC_PER_NODE or NNODES is set,
pt/sft/rlhf re-run themselves under `torch.distributed.run` (see docs/cli.md).
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

from swift.utils.registry import closest

# command -> (module:function, one-line description)
ROUTE_MAPPING: dict[str, tuple[str, str]] = {
    "pt": ("swift.pipelines.train:pt_main", "Pre-train / continue pre-training (loss on every token)."),
    "sft": ("swift.pipelines.train:sft_main", "Supervised fine-tuning, full or LoRA, on conversations."),
    "rlhf": ("swift.pipelines.rlhf:rlhf_main", "Preference alignment and online RL (DPO family, KTO, RM, PRM, GKD, GRPO family)."),
    "infer": ("swift.pipelines.infer:infer_main", "Chat in the terminal, or batch-infer a dataset to jsonl."),
    "eval": ("swift.pipelines.eval:eval_main", "Score a model or an OpenAI-compatible endpoint on benchmarks (gsm8k, math500, ...)."),
    "sample": ("swift.pipelines.sample:sample_main", "Best-of-n / rejection sampling and distillation into sft and DPO data."),
    "rollout": ("swift.pipelines.rollout:rollout_main", "Generation server for RL trainers, with checked weight sync."),
    "deploy": ("swift.pipelines.deploy:deploy_main", "Serve a model (and LoRA adapters) behind an OpenAI-compatible API."),
    "merge-lora": ("swift.pipelines.merge_lora:merge_lora_main", "Merge LoRA adapters into a standalone HF model."),
}
ARGUMENT_CLASSES = {
    "pt": "swift.arguments:PtArguments",
    "sft": "swift.arguments:SftArguments",
    "rlhf": "swift.arguments.rlhf:RLHFArguments",
    "infer": "swift.pipelines.infer:InferArguments",
    "eval": "swift.pipelines.eval:EvalArguments",
    "sample": "swift.pipelines.sample:SampleArguments",
    "rollout": "swift.pipelines.rollout:RolloutArguments",
    "deploy": "swift.pipelines.deploy:DeployArguments",
    "merge-lora": "swift.pipelines.merge_lora:MergeLoraArguments",
}
DISTRIBUTED_COMMANDS = {"pt", "sft", "rlhf"}
LAUNCH_ENV = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def _import(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def usage() -> str:
    width = max(len(c) for c in ROUTE_MAPPING)
    lines = ["usage: swift <command> [flags]   (swift <command> --help lists every flag)", "", "commands:"]
    lines += [f"  {c.ljust(width)}  {desc}" for c, (_, desc) in ROUTE_MAPPING.items()]
    return "\n".join(lines)


def torchrun_command(command: str, argv: list[str], env: dict[str, str]) -> list[str]:
    """The `python -m torch.distributed.run ...` line that re-runs this command on every rank."""
    launch = [sys.executable, "-m", "torch.distributed.run",
              "--nproc_per_node", env.get("NPROC_PER_NODE", "1"),
              "--nnodes", env.get("NNODES", "1"),
              "--node_rank", env.get("NODE_RANK", "0"),
              "--master_addr", env.get("MASTER_ADDR", "127.0.0.1"),
              "--master_port", env.get("MASTER_PORT", "29500")]
    return launch + ["-m", "swift.cli.main", command, *argv]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        raise SystemExit(0 if argv else 2)
    if argv[0] in ("-V", "--version"):
        from swift import __version__

        print(f"swift {__version__}")
        raise SystemExit(0)
    command, rest = argv[0].replace("_", "-"), argv[1:]
    if command not in ROUTE_MAPPING:
        print(f"swift: unknown command '{argv[0]}'.{closest(command, ROUTE_MAPPING)} "
              f"Commands: {', '.join(ROUTE_MAPPING)}", file=sys.stderr)
        raise SystemExit(2)
    env = os.environ
    launched = "LOCAL_RANK" in env  # already a torchrun worker
    if command in DISTRIBUTED_COMMANDS and not launched and ("NPROC_PER_NODE" in env or "NNODES" in env):
        raise SystemExit(subprocess.call(torchrun_command(command, rest, dict(env))))
    run(command, rest)


def run(command: str, argv: list[str]) -> None:
    from swift.arguments.parser import ArgumentError, print_help
    from swift.utils.registry import SwiftError

    prog = f"swift {command}"
    if "-h" in argv or "--help" in argv:
        print_help(_import(ARGUMENT_CLASSES[command]), prog)
        raise SystemExit(0)
    try:
        _import(ROUTE_MAPPING[command][0])(argv)
        _leave_process_group()
    except ArgumentError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except SwiftError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def _leave_process_group() -> None:
    """End a distributed run together: every rank waits for the others, then tears its group down.

    Left to interpreter exit, ranks tear their groups down in no set order while a peer's
    communication threads may still run; CI once saw a rank abort (SIGABRT) after a run had
    trained and saved successfully.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
