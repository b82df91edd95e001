"""`swift rlhf` from other tools' descriptions (swift/arguments/peer_configs.py): the TRL/verl
rlhf.yaml of shared/seeds/003 (DPO from its top-level keys, PPO and GRPO from its `ppo:` section) and
verl's key=value overrides; what each key becomes, runs through the CLI, and the one-line refusals."""
import glob
import json
import os

import pytest
import yaml

from swift.arguments.parser import ArgumentError, parse_args
from swift.arguments.peer_configs import parse_value
from swift.arguments.rlhf import RLHFArguments
from swift.cli.main import main
from swift.utils.logging import get_logger

get_logger()  # its handler keeps the stderr it is made with: made here, not inside a test's capsys
A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."


def write_data(tmp_path) -> None:
    """DPO pairs under the seed's column aliases; prompts as verl writes them (a chat list, parquet)."""
    import pandas as pd

    pairs = [{"prompt": "12+30=", "chosen": "42", "rejected": "41"},
             {"question": "20+21=", "response_chosen": "41", "response_rejected": "40"},
             {"query": "11+11=", "answer": "22", "negative": "23"},
             {"question": "10+15=", "answer": "25", "rejected": "26"}]
    (tmp_path / "dpo.jsonl").write_text("\n".join(json.dumps(p) for p in pairs * 2))
    sums = [(a, b) for a in range(10, 14) for b in range(20, 22)]
    pd.DataFrame({"question": [[{"role": "user", "content": f"{a}+{b}="}] for a, b in sums],
                  "solution": [str(a + b) for a, b in sums]}).to_parquet(tmp_path / "prompts.parquet")
    pd.DataFrame({"prompt": [f"{a}+{b}=" for a, b in sums],
                  "solution": [str(a + b) for a, b in sums]}).to_parquet(tmp_path / "plain.parquet")


def seed_config(tmp_path) -> dict:
    """An rlhf.yaml as shared/seeds/003 describes it: one file for the DPO, PPO and GRPO scripts."""
    return {
        "model_name_or_path": "builtin:tiny-chat", "ref_model_name_or_path": "builtin:tiny-chat",
        "tokenizer_name_or_path": "builtin:tiny-chat",
        "data": {"train_file": str(tmp_path / "dpo.jsonl"), "eval_file": str(tmp_path / "dpo.jsonl"), "max_length": 96},
        "beta": 0.2, "loss_type": "ipo",
        "peft": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
                 "task_type": "CAUSAL_LM"},
        "training_args": {"output_dir": str(tmp_path / "dpo"), "learning_rate": "5e-5", "num_train_epochs": 1,
                          "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "logging_steps": 1,
                          "save_steps": 50, "bf16": False, "seed": 7, "max_steps": 2},
        "trace": "none",
        "ppo": {"train_file": str(tmp_path / "prompts.parquet"), "eval_file": str(tmp_path / "prompts.parquet"),
                "prompt_key": "question", "max_prompt_length": 64, "max_response_length": 4,
                "rollout_backend": "hf", "rollout_n": 2, "rollout_tp": 1, "rollout_gpu_memory_utilization": 0.4,
                "load_format": "dummy_dtensor", "actor_lr": 1e-3, "ppo_epochs": 2, "ppo_mini_batch_size": 2,
                "ppo_micro_batch_size_per_gpu": 2, "kl_loss_coef": 0.002, "kl_loss_type": "low_var_kl",
                "use_kl_loss": True, "use_kl_in_reward": False, "reward_micro_batch_size_per_gpu": 4,
                "reward_max_length": 2048, "n_gpus_per_node": 1, "nnodes": 1, "logger": ["console"],
                "project_name": "proj", "experiment_name": "exp", "save_freq": -1, "test_freq": 3},
    }


def write_yaml(tmp_path, config: dict, name: str = "rlhf.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return str(path)


def parse(*argv: str) -> RLHFArguments:
    return parse_args(RLHFArguments, list(argv))


def refused(capsys, *argv: str) -> str:
    """Run the CLI; it must stop with exit status 2 and one line."""
    with pytest.raises(SystemExit) as stop:
        main(["rlhf", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# -- the rlhf.yaml ----------------------------------------------------------------------------------------


def test_dpo_reads_the_top_level_keys_and_not_the_ppo_section(tmp_path):
    config = seed_config(tmp_path)
    config["ppo"]["rollout_backend"] = "vllm"  # the PPO script's; DPO does not apply it
    a = parse("--config", write_yaml(tmp_path, config))
    assert a.rlhf_type == "dpo" and a.model == "builtin:tiny-chat" and a.ref_model is None  # same model: our default
    assert a.dataset == [str(tmp_path / "dpo.jsonl")] and a.val_dataset == a.dataset and a.max_length == 96
    assert (a.beta, a.loss_type) == (0.2, ["ipo"])
    assert (a.tuner_type, a.lora_rank, a.lora_alpha, a.lora_dropout, a.target_modules) == \
        ("lora", 4, 8, 0.0, ["q_proj", "v_proj"])
    assert a.output_dir == str(tmp_path / "dpo") and a.learning_rate == 5e-5 and a.seed == 7 and a.max_steps == 2
    assert (a.per_device_train_batch_size, a.logging_steps, a.save_steps, a.bf16) == (2, 1, 50, False)
    assert a.report_to in ([], ["none"])
    assert a.use_vllm is False and a.num_generations is None  # the ppo section is checked, not applied
    assert parse("--config", write_yaml(tmp_path, config), "--beta", "0.3").beta == 0.3  # flags win
    del config["peft"]
    assert parse("--config", write_yaml(tmp_path, config)).tuner_type == "full"  # as TRL without a peft_config


def test_ppo_reads_the_ppo_section_in_verl_units(tmp_path):
    config = {**seed_config(tmp_path), "rlhf_type": "ppo"}
    config["ppo"]["use_kl_loss"] = False  # verl's PPO would put a KL term in the actor's loss, which ours has not
    a = parse("--config", write_yaml(tmp_path, config), "--reward_funcs", "accuracy")
    assert a.rlhf_type == "ppo" and a.model == "builtin:tiny-chat" and a.tuner_type == "lora" and a.lora_rank == 4
    assert a.dataset == [str(tmp_path / "prompts.parquet")] and json.loads(a.columns) == {"question": "prompt"}
    assert a.max_completion_length == 4 and a.use_vllm is False and a.num_generations == 2
    assert a.learning_rate == 1e-3 and a.num_iterations == 2
    # verl: 2 prompts × 2 completions per optimizer step, 2 completions per forward
    assert a.per_device_train_batch_size == 2 and a.per_device_train_batch_size * a.gradient_accumulation_steps == 2 * 2
    assert a.beta == 0 and a.kl_estimator == "k1"  # use_kl_in_reward false: no KL; kl_loss_* are GRPO's
    # test_freq counts rollout batches: 3 of them, of ppo_epochs optimizer steps each
    assert a.eval_steps == 3 * 2 and str(a.save_strategy.value) == "no"
    assert a.output_dir == os.path.join("checkpoints", "proj", "exp") and a.run_name == "exp"
    assert a.report_to in ([], ["none"])
    # the DPO keys are not applied
    assert a.max_length is None and a.seed == 42 and a.max_steps == -1  # (None: the model's context)


def test_grpo_reads_the_same_section_with_the_kl_in_the_loss(tmp_path):
    config = seed_config(tmp_path)
    config["ppo"]["reward_model_name_or_path"] = str(tmp_path / "rm")
    a = parse("--config", write_yaml(tmp_path, config), "--rlhf_type", "grpo")
    assert a.rlhf_type == "grpo" and a.num_generations == 2 and a.reward_model == str(tmp_path / "rm")
    assert (a.beta, a.kl_estimator) == (0.002, "k3")  # use_kl_loss, kl_loss_coef, low_var_kl
    assert a.per_device_train_batch_size * a.gradient_accumulation_steps == 2 * 2
    config["ppo"]["use_kl_loss"] = False
    assert parse("--config", write_yaml(tmp_path, config), "--rlhf_type", "grpo").beta == 0


@pytest.mark.parametrize("section,key,value", [
    (None, "learning_rate", 1e-5), ("data", "max_prompt_length", 64), ("peft", "rank", 8),
    ("training_args", "max_epochs", 3), ("ppo", "rollout_temperature", 0.7)])
@pytest.mark.parametrize("rlhf_type", ["dpo", "grpo"])
def test_an_unknown_key_in_any_section_names_key_and_file(tmp_path, capsys, section, key, value, rlhf_type):
    config = seed_config(tmp_path)
    (config[section] if section else config)[key] = value
    path = write_yaml(tmp_path, config)
    err = refused(capsys, "--config", path, "--rlhf_type", rlhf_type)  # checked in the section not applied too
    assert path in err and (f"{section}.{key}" if section else key) in err


@pytest.mark.parametrize("change,message", [
    ({"ppo": {"rollout_backend": "sglang"}}, "ppo.rollout_backend: SGLang rollouts are not in this version"),
    ({"ppo": {"n_gpus_per_node": 8}}, "ppo.n_gpus_per_node: 8, but this run has 1: launch with NPROC_PER_NODE=8"),
    ({"ppo": {"rollout_tp": 2}}, "ppo.rollout_tp: 2: each vLLM engine runs on one device"),
    ({"ppo": {"reward_max_length": 4096}}, "ppo.reward_max_length: 4096: swift's reward model reads up to 2048"),
    ({"ppo": {"ppo_micro_batch_size_per_gpu": 3}}, "ppo.ppo_micro_batch_size_per_gpu: 3 is not a multiple of 2"),
    ({"trace": "swanlab"}, "trace: 'swanlab': SwanLab is not built in"),
    ({"ppo": {"logger": ["wandb"]}}, "both set --report_to"),
    ({"tokenizer_name_or_path": "other"}, "tokenizer_name_or_path: swift loads the tokenizer from the model's"),
])
def test_what_grpo_cannot_run_is_refused_in_one_line(tmp_path, capsys, change, message):
    config = seed_config(tmp_path)
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    path = write_yaml(tmp_path, config)
    err = refused(capsys, "--config", path, "--rlhf_type", "grpo", "--reward_funcs", "accuracy")
    assert f"{path}: " in err and message in err


def test_ppo_refuses_a_kl_in_the_actor_loss(tmp_path, capsys):
    path = write_yaml(tmp_path, seed_config(tmp_path))
    err = refused(capsys, "--config", path, "--rlhf_type", "ppo")
    assert "ppo.use_kl_loss: swift's --rlhf_type ppo has its KL term in the reward" in err


def test_dpo_runs_from_the_file(tmp_path):
    write_data(tmp_path)
    config = seed_config(tmp_path)
    del config["data"]["eval_file"]
    main(["rlhf", "--config", write_yaml(tmp_path, config), "--add_version", "false", "--disable_tqdm", "true"])
    out = tmp_path / "dpo"
    logs = [json.loads(line) for line in (out / "logging.jsonl").read_text().splitlines()]
    steps = [r for r in logs if "loss" in r]
    assert [r["global_step"] for r in steps] == [1, 2] and all(r["loss"] == r["loss"] for r in steps)
    assert "rewards/margins" in steps[0]  # the DPO trainer, on pairs read under every alias
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4


@pytest.mark.parametrize("rlhf_type", ["ppo", "grpo"])
def test_ppo_and_grpo_run_from_the_ppo_section(tmp_path, monkeypatch, rlhf_type):
    monkeypatch.chdir(tmp_path)  # verl's checkpoints/PROJECT/EXPERIMENT
    write_data(tmp_path)
    config = seed_config(tmp_path)
    del config["ppo"]["eval_file"]
    config["ppo"].update(use_kl_loss=rlhf_type == "grpo", ppo_epochs=1)
    main(["rlhf", "--config", write_yaml(tmp_path, config), "--rlhf_type", rlhf_type, "--reward_funcs", "accuracy",
          "--max_steps", "2", "--logging_steps", "1", "--add_version", "false", "--disable_tqdm", "true"])
    out = tmp_path / "checkpoints" / "proj" / "exp"
    logs = [json.loads(line) for line in open(os.path.join(out, "logging.jsonl"))]
    steps = [r for r in logs if "loss" in r]
    assert [r["global_step"] for r in steps] == [1, 2]
    assert all(r["completions/max_length"] <= 4 for r in steps)  # ppo.max_response_length
    args = json.load(open(os.path.join(out, "args.json")))
    assert (args["rlhf_type"], args["num_generations"], args["gradient_accumulation_steps"]) == (rlhf_type, 2, 2)


def test_the_example_file_of_docs_rlhf_md_parses_as_it_says(tmp_path, capsys):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "docs", "rlhf.md"), encoding="utf-8").read()
    block = text.split("## Configs from other tools", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "rlhf.yaml"
    path.write_text(block)
    dpo = parse("--config", str(path))
    assert (dpo.rlhf_type, dpo.beta, dpo.tuner_type, dpo.report_to) == ("dpo", 0.1, "lora", ["wandb"])
    grpo = parse("--config", str(path), "--rlhf_type", "grpo", "--reward_funcs", "accuracy")
    assert (grpo.num_generations, grpo.use_vllm, grpo.beta) == (8, True, 0.001)
    assert grpo.output_dir == os.path.join("checkpoints", "rlhf", "grpo")
    assert "ppo.use_kl_loss" in refused(capsys, "--config", str(path), "--rlhf_type", "ppo")


# -- verl's overrides -------------------------------------------------------------------------------------


def test_override_values_parse_as_hydra_does():
    assert [parse_value(v) for v in ("8", "1e-6", "0.2", "true", "False", "null", "1_000", "'a b'", "[console,wandb]",
                                     "['console', 'wandb']", "[]", "token-mean")] == \
        [8, 1e-6, 0.2, True, False, None, 1000, "a b", ["console", "wandb"], ["console", "wandb"], [], "token-mean"]


BASE = ["--model", "builtin:tiny-chat", "--dataset", "d.jsonl", "--reward_funcs", "accuracy"]


def test_grpo_overrides_map_onto_our_flags_with_verls_batch_meaning():
    a = parse(*BASE, "--rlhf_type", "grpo", "algorithm.adv_estimator=rloo", f"{R}n=4", "data.train_batch_size=8",
              f"{A}ppo_mini_batch_size=4", f"{A}ppo_micro_batch_size_per_gpu=8", f"{A}ppo_epochs=2",
              "trainer.total_training_steps=3", "trainer.save_freq=2", "trainer.test_freq=1",
              f"{A}use_kl_loss=true", f"{A}kl_loss_coef=0.001", f"{A}kl_loss_type=mse", f"{A}clip_ratio_low=0.2",
              f"{A}clip_ratio_high=0.28",
              f"{A}loss_agg_mode=seq-mean-token-mean", f"{A}optim.lr=1e-6", f"{R}temperature=0.7", f"{R}top_p=0.9",
              f"{R}name=vllm", f"{R}gpu_memory_utilization=0.6", "data.max_response_length=16",
              "actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32",
              "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", "trainer.logger=['console','wandb']",
              "trainer.default_local_dir=runs/x", "trainer.experiment_name=e1", "data.prompt_key=question",
              "custom_reward_function.path=r.py", "custom_reward_function.name=score")
    completions_per_step = a.per_device_train_batch_size * a.gradient_accumulation_steps
    assert completions_per_step == 4 * 4  # ppo_mini_batch_size counts prompts
    assert a.per_device_train_batch_size * a.steps_per_generation == 8 * 4  # data.train_batch_size too
    steps_per_rollout = a.steps_per_generation // a.gradient_accumulation_steps * a.num_iterations
    assert steps_per_rollout == 2 * 2  # two mini-batches, two epochs
    assert (a.max_steps, a.save_steps, a.eval_steps) == (3 * 4, 2 * 4, 1 * 4)  # verl counts rollout batches
    # verl's KL loss stays a loss term with rloo too (ms-swift's rloo would subtract it from the rewards)
    assert (a.advantage_estimator, a.num_generations, a.beta, a.kl_estimator) == ("rloo", 4, 0.001, "k2")
    assert a.kl_in_reward is False
    assert (a.epsilon, a.epsilon_high, a.loss_type, a.learning_rate) == (0.2, 0.28, ["grpo"], 1e-6)
    assert (a.temperature, a.top_p, a.use_vllm, a.vllm_gpu_memory_utilization, a.max_completion_length) == \
        (0.7, 0.9, True, 0.6, 16)
    assert (a.tuner_type, a.lora_rank, a.lora_alpha, a.target_modules) == ("lora", 16, 32, ["q_proj", "v_proj"])
    assert (a.report_to, a.output_dir, a.run_name) == (["wandb"], "runs/x", "e1")
    assert json.loads(a.columns) == {"question": "prompt"}
    assert (a.custom_reward_function_path, a.custom_reward_function_name) == ("r.py", "score")


@pytest.mark.parametrize("overrides,expected", [
    (["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false"], {"scale_rewards": "none"}),
    (["algorithm.adv_estimator=rloo", f"{A}use_kl_loss=false"], {"advantage_estimator": "rloo", "beta": 0}),
    (["algorithm.adv_estimator=reinforce_plus_plus"], {"advantage_estimator": "reinforce"}),
    (["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
     {"advantage_estimator": "reinforce_baseline", "scale_rewards": "batch"}),
    ([f"{A}use_kl_loss=false"], {"beta": 0}),
    ([f"{A}clip_ratio=0.3", f"{A}clip_ratio_low=0.1"], {"epsilon": 0.1, "epsilon_high": 0.3}),
    ([f"{A}loss_agg_mode=token-mean"], {"loss_type": ["dapo"]}),
    (["actor_rollout_ref.model.lora_rank=0"], {"tuner_type": "full"}),
    ([f"{R}name=hf", f"{R}tensor_model_parallel_size=1", f"{A}entropy_coeff=0"], {"use_vllm": False}),
])
def test_each_grpo_override_means_what_it_means_in_verl(overrides, expected):
    a = parse(*BASE, "--rlhf_type", "grpo", *overrides)
    assert {k: getattr(a, k) for k in expected} == expected


def test_ppo_overrides_map_onto_the_critic_and_the_kl_in_the_reward():
    a = parse(*BASE, "--rlhf_type", "ppo", "algorithm.adv_estimator=gae", "algorithm.gamma=0.99", "algorithm.lam=0.9",
              "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.01", "algorithm.kl_penalty=low_var_kl",
              "algorithm.kl_ctrl.type=fixed", "critic.model.path=c", "critic.optim.lr=1e-5",
              "critic.cliprange_value=0.5", "data.train_batch_size=16", f"{A}ppo_mini_batch_size=8",
              f"{A}ppo_micro_batch_size_per_gpu=4", "reward_model.enable=true", "reward_model.model.path=rm",
              "trainer.n_gpus_per_node=1", "trainer.nnodes=1")
    assert (a.gamma, a.lam, a.beta, a.kl_estimator) == (0.99, 0.9, 0.01, "k3")
    assert (a.critic_model, a.critic_learning_rate, a.cliprange_value, a.reward_model) == ("c", 1e-5, 0.5, "rm")
    assert a.per_device_train_batch_size * a.gradient_accumulation_steps == 8  # n = 1: prompts are completions
    assert a.num_mini_batches == 16 // 8
    assert parse(*BASE, "--rlhf_type", "ppo", "algorithm.use_kl_in_reward=false").beta == 0


@pytest.mark.parametrize("argv,message", [
    (["--rlhf_type", "grpo", "algorithm.adv_estimatr=grpo"],
     "unknown verl override 'algorithm.adv_estimatr'. Did you mean 'algorithm.adv_estimator'?"),
    (["--rlhf_type", "grpo", "rollout.n=4"], "unknown verl override 'rollout.n'. Did you mean '" + R + "n'?"),
    (["--rlhf_type", "grpo", f"{R}name=sglang"], "SGLang rollouts are not in this version"),
    (["--rlhf_type", "grpo", "algorithm.adv_estimator=gae"], "gae learns a critic: run it with --rlhf_type ppo"),
    (["--rlhf_type", "ppo", "algorithm.adv_estimator=grpo"], "--rlhf_type ppo estimates advantages with its critic"),
    (["--rlhf_type", "grpo", "algorithm.adv_estimator=remax"], "'remax' has no swift estimator"),
    (["--rlhf_type", "grpo", f"{A}loss_agg_mode=seq-mean-token-sum-norm"], "no --loss_type equals it"),
    (["--rlhf_type", "grpo", f"{A}use_kl_loss=true", f"{A}kl_loss_type=abs"],
     "'abs': swift's KL estimators are k1 (kl), k2 (mse) and k3"),
    (["--rlhf_type", "grpo", f"{A}kl_loss_coef=0.001"], "does nothing in verl unless " + A + "use_kl_loss=true"),
    (["--rlhf_type", "ppo", "algorithm.kl_ctrl.kl_coef=0.01"],
     "does nothing in verl unless algorithm.use_kl_in_reward=true"),
    (["--rlhf_type", "grpo", f"{A}entropy_coeff=0.01"], "0.01: swift's policy loss has no entropy bonus"),
    (["--rlhf_type", "grpo", "algorithm.use_kl_in_reward=true"], "has its KL term in the loss"),
    (["--rlhf_type", "ppo", "algorithm.kl_ctrl.type=adaptive"], "verl's adaptive controller steers the per-token"),
    (["--rlhf_type", "grpo", "algorithm.gamma=0.9"], "does nothing for --rlhf_type grpo"),
    (["--rlhf_type", "grpo", f"{R}n=4", f"{A}ppo_mini_batch_size=3"], "3 prompts × 4 completions is not a whole"),
    (["--rlhf_type", "grpo", f"{R}n=four"], f"verl override {R}n takes an integer, got 'four'"),
    (["--rlhf_type", "grpo", "reward_model.model.path=rm"], "verl loads it only with reward_model.enable=true"),
    (["--rlhf_type", "grpo", "--num_generations", "4", f"{R}n=4"],
     f"--num_generations and verl override {R}n both set --num_generations"),
    (["--rlhf_type", "grpo", "--gradient_accumulation_steps", "2", f"{A}ppo_mini_batch_size=2"],
     f"--gradient_accumulation_steps and verl override {A}ppo_mini_batch_size both set"),
    ([f"{R}n=4"], "verl overrides (" + R + "n=...) run --rlhf_type grpo or ppo, not dpo"),
])
def test_an_override_that_cannot_be_mapped_is_refused(argv, message):
    with pytest.raises(ArgumentError) as e:
        parse(*BASE, *argv)
    assert message in str(e.value)


def test_grpo_runs_from_overrides_alone(tmp_path, capsys):
    write_data(tmp_path)
    out = tmp_path / "run"
    main(["rlhf", "--rlhf_type", "grpo", "--reward_funcs", "accuracy", "actor_rollout_ref.model.path=builtin:tiny-chat",
          f"data.train_files=[{tmp_path / 'plain.parquet'}]", "data.train_batch_size=4", "data.max_response_length=4",
          f"{R}n=2", f"{R}name=hf", f"{A}ppo_mini_batch_size=2", f"{A}ppo_micro_batch_size_per_gpu=2",
          f"{A}use_kl_loss=false", "actor_rollout_ref.model.lora_rank=4", "trainer.total_training_steps=1",
          "trainer.save_freq=-1", "trainer.logger=[console]", f"trainer.default_local_dir={out}"])
    (run,) = glob.glob(str(out / "v*"))
    result = json.load(open(os.path.join(run, "result.json")))
    # one rollout batch: 4 of the 8 prompts × 2 completions, in two optimizer steps of 2 prompts
    assert (result["global_step"], result["metrics"]["epoch"]) == (2, 0.5)
    assert result["metrics"]["completions/max_length"] <= 4
    assert json.load(open(os.path.join(run, "args.json")))["beta"] == 0
