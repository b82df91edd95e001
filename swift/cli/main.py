"""`swift <command> [flags]`: route a subcommand to its pipeline.

The only module that reads launcher environment variables: when NPROC_PER_NODE or NNODES is set,
pt/sft/rlhf re-run themselves under `torch.distributed.run` (see docs/cli.md); the other commands
run as one process and refuse them above 1.
"""
from __future__ import annotations

import gc
import importlib
import os
import signal
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
    "export": ("swift.pipelines.export:export_main", "Merge LoRA, quantize (bnb, GPTQ), write GGUF and an Ollama Modelfile, cache encoded data, upload."),
    "attack": ("swift.safety.attack:attack_main", "Jailbreak attacks (GCG, BEAST) on a model: adversarial suffixes and attack success rate."),
    "estimate": ("swift.safety.estimate:estimate_main", "Estimate the probability of a rare output (ITGIS, MHIS, brute force, exact)."),
    "app": ("swift.pipelines.app:app_main", "A chat page (gradio) over a model or an OpenAI-compatible server."),
    "web-ui": ("swift.pipelines.app:web_ui_main", "A console (gradio) that launches, watches and stops runs."),
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
    "export": "swift.arguments.export:ExportArguments",
    "attack": "swift.safety.attack:AttackArguments",
    "estimate": "swift.safety.estimate:EstimateArguments",
    "app": "swift.pipelines.app:AppArguments",
    "web-ui": "swift.pipelines.app:WebUIArguments",
}
DISTRIBUTED_COMMANDS = {"pt", "sft", "rlhf"}
LAUNCH_ENV = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_TIMEOUT")
# seconds the nodes wait for each other to join (`--rdzv_conf timeout=` of torchrun's static rendezvous)
DEFAULT_RDZV_TIMEOUT = "600"


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
              "--master_port", env.get("MASTER_PORT", "29500"),
              "--rdzv_conf", f"timeout={env.get('RDZV_TIMEOUT', DEFAULT_RDZV_TIMEOUT)}"]
    return launch + ["-m", "swift.cli.main", command, *argv]


def launch(command: str, argv: list[str], env: dict[str, str]) -> int:
    """Run this command under torchrun; on a failed run of several nodes, end with one line saying so
    (above it, torchrun's report and the failing rank's own error)."""
    code = _supervise(command, torchrun_command(command, argv, env))
    nodes = env.get("NNODES", "1")  # a number, or torchrun's MIN:MAX
    if code not in (0, 130) and nodes not in ("1", "1:1"):
        timeout = env.get("RDZV_TIMEOUT", DEFAULT_RDZV_TIMEOUT)
        master = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{env.get('MASTER_PORT', '29500')}"
        print(f"swift {command}: error: node {env.get('NODE_RANK', '0')} of {nodes} ends (exit code {code}): a rank "
              f"failed, or a node died or did not join within RDZV_TIMEOUT={timeout} s (master {master})",
              file=sys.stderr)
    return code


# signals passed on to torchrun, which ends its ranks on them (SIGINT arrives as KeyboardInterrupt)
FORWARDED = (signal.SIGTERM, signal.SIGHUP)


def _supervise(command: str, cmd: list[str]) -> int:
    """Run torchrun and wait for it, passing it every interrupt and termination, so it ends its ranks
    before this process ends (before 2026-12-07 a Ctrl-C killed torchrun 0.25 s later, its ranks
    orphaned, and printed a traceback). torchrun runs in a session (and process group) of its own: a
    Ctrl-C at the terminal reaches this process only, and torchrun gets it once, from here (a second
    SIGINT while it ends its ranks would cut that short). A second Ctrl-C kills torchrun's process
    group (torchrun starts each rank in a session of its own: ranks it had not ended yet may then
    outlive it)."""
    import threading

    started: list[subprocess.Popen] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():  # where Python runs signal handlers
        # installed before torchrun starts, so no signal falls between the two
        def forward(sig, _frame):
            if started:
                _signal(started[0], sig)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    interrupted = 0
    try:
        started.append(subprocess.Popen(cmd, start_new_session=True))
        proc = started[0]
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                interrupted += 1
                if interrupted == 1:
                    _signal(proc, signal.SIGINT)
                else:
                    _signal(proc, signal.SIGKILL, group=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if interrupted:
        print(f"swift {command}: interrupted", file=sys.stderr)
        return 130
    return code


def _signal(proc: subprocess.Popen, sig: int, group: bool = False) -> None:
    try:
        os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    except ProcessLookupError:
        pass  # it has ended


def refuse_launch_env(command: str, env) -> str | None:
    """The line refusing NPROC_PER_NODE / NNODES above 1 for a command that runs as one process (before
    2026-12-07 they were ignored). `swift web-ui` passes its environment to the runs it launches."""
    if command in DISTRIBUTED_COMMANDS or command == "web-ui" or "LOCAL_RANK" in env:
        return None
    for name in ("NPROC_PER_NODE", "NNODES"):
        value = env.get(name, "1").strip()
        if value not in ("", "1", "1:1"):
            launchers = "/".join(c for c in ROUTE_MAPPING if c in DISTRIBUTED_COMMANDS)
            return (f"swift {command}: error: {name}={value}: swift {command} runs as one process (only {launchers} "
                    f"start several); unset {name}")
    return None


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
    refused = refuse_launch_env(command, env)
    if refused:
        print(refused, file=sys.stderr)
        raise SystemExit(2)
    launched = "LOCAL_RANK" in env  # already a torchrun worker
    if command in DISTRIBUTED_COMMANDS and not launched and ("NPROC_PER_NODE" in env or "NNODES" in env):
        raise SystemExit(launch(command, rest, dict(env)))
    run(command, rest)


def run(command: str, argv: list[str]) -> None:
    prog = f"swift {command}"
    if "-h" in argv or "--help" in argv:
        print(help_text(command), end="")
        raise SystemExit(0)
    from swift.arguments.parser import ArgumentError
    from swift.utils.registry import SwiftError

    try:
        entry = _import(ROUTE_MAPPING[command][0])
        # the imports' objects (~600k for the training stack) live as long as the process: out of the
        # cyclic collector's way, a full pass (accelerate's at the end of training, ...) takes ms, not 0.3 s.
        # Once per process: a later call (main() run again from Python) would also freeze its runs' leftovers
        if not gc.get_freeze_count():
            gc.freeze()
        entry(argv)
        if _leave_process_group():
            _exit_without_teardown()
    except ArgumentError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except SwiftError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


# what `swift <command> --help` prints depends on these packages' versions (the training commands'
# flags include transformers' TrainingArguments) besides the swift package's own files
HELP_PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate")


def help_text(command: str) -> str:
    """`swift <command> --help`'s text. Making it imports the command's argument classes (torch and
    transformers: seconds); it is kept in the user's cache (`$SWIFT_CACHE_HOME`, else
    `$XDG_CACHE_HOME/swift`, else `~/.cache/swift`) under a key of everything it is made from: the
    swift package's files (path, size, mtime), the versions of HELP_PACKAGES, the Python version and
    the terminal width. A later call with the same key prints the kept text without those imports."""
    import hashlib
    import shutil
    from importlib.metadata import PackageNotFoundError, version

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256(f"{command}\0{sys.version}\0{shutil.get_terminal_size().columns}".encode())
    for package in HELP_PACKAGES:
        try:
            h.update(f"\0{package}={version(package)}".encode())
        except PackageNotFoundError:
            h.update(f"\0{package}=-".encode())
    sources = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # bytecode written by this very call changes nothing
        sources += [os.path.join(folder, name) for name in files]
    for path in sorted(sources):
        st = os.stat(path)
        h.update(f"\0{os.path.relpath(path, root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    from swift.utils.io import cache_home

    path = os.path.join(cache_home(), "help", f"{command}-{h.hexdigest()[:20]}.txt")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        pass
    from swift.arguments.parser import build_parser

    text = build_parser(_import(ARGUMENT_CLASSES[command]), f"swift {command}").format_help()
    try:  # a read-only or full cache only costs the next call its imports
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):  # this command's texts of other keys are out of date
            if old.startswith(f"{command}-") and old.endswith(".txt"):
                os.remove(os.path.join(folder, old))
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass
    return text


def _leave_process_group() -> bool:
    """End a distributed run together: every rank waits for the others, then tears its group down.
    True when this process was a rank of one.

    Left to interpreter exit, ranks tear their groups down in no set order while a peer's
    communication threads may still run; CI once saw a rank abort (SIGABRT) after a run had
    trained and saved successfully.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        return True
    return False


def _exit_without_teardown() -> None:
    """A rank whose run has ended and saved everything leaves at once: non-daemon threads are joined,
    exit handlers run and streams are flushed, as at a normal exit, but the interpreter is not
    finalised.

    Finalisation tears down what the run leaves alive (the FSDP/DeepSpeed state still holds its
    process groups and their C++ threads; daemon threads are stopped mid-call) and now and then
    aborted a rank with `terminate called without an active exception` (SIGABRT) after a run had
    trained, saved and left its process group: twice in CI, an FSDP2 resume on 2 gloo ranks, once
    before the barrier above existed and once after. The launcher then reports the run as failed.
    """
    import atexit
    import logging
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what exit does first: thread pools finish their
    if shutdown is not None:  # queued work, non-daemon threads are joined
        shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)

if __name__ == "__main__":
    main()
