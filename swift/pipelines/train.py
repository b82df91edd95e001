"""`swift sft` and `swift pt`: load → template → data → tuner → Trainer → save."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import set_seed
from transformers.trainer_utils import get_last_checkpoint

from swift.arguments import PtArguments, SftArguments
from swift.arguments.template import model_max_length
from swift.dataset.encode import (Collator, LazyDataset, ListDataset, PaddingFreeCollator, StreamingDataset, encode_rows,
                                  pack)
from swift.dataset.loader import DATA_SEED, RowSet, check_specs, load_rows, read_rows
from swift.dataset.self_cognition import fill_identity
from swift.model import load_model
from swift.model.loader import bnb_config, resolve_dtype
from swift.pipelines.base import resolve_args
from swift.template import choose_template, get_template
from swift.trainers.callbacks import ArgsInCheckpointCallback, JsonlLogCallback, build_callback
from swift.trainers.fsdp import check_fsdp_ran, fsdp_on_cpu, save_whole_model, whole
from swift.trainers.trainer import SwiftTrainer
from swift.tuners import prepare_model
from swift.utils.io import write_json
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


def mixed_precision(training_args, dtype: torch.dtype) -> None:
    """bf16 weights train with bf16 mixed precision, as with `--bf16 true`. Setting the flag after
    `TrainingArguments` was built does not reach its `mixed_precision`, which the trainer's
    accelerator reads, so both are set here. Under FSDP, bf16 weights train in bf16 without autocast
    (its mixed precision would upcast them to fp32 master weights; `--bf16 true` asks for that).
    fp16 weights only set `fp16` (no autocast and no loss scaler, which would refuse fp16
    gradients); `--fp16 true` on the command line asks for both."""
    training_args.fp16 = training_args.fp16 or dtype == torch.float16
    if dtype == torch.bfloat16 and not training_args.fp16:
        training_args.bf16 = True
        if not training_args.fsdp:  # FSDP's mixed precision would keep fp32 copies of bf16 weights
            training_args.mixed_precision = "bf16"


class TrainPipeline:
    trainer_cls = SwiftTrainer
    task_types = ("causal_lm",)

    def __init__(self, args: SftArguments):
        self.args = args
        if args.streaming and args.data_seed is not None:
            raise SwiftError("--data_seed: --streaming reads rows in order and samples none (#N takes the first N "
                             "rows); leave it out, or drop --streaming")
        if args.data_seed is None and not args.streaming:  # ms-swift's 42, whatever --seed is (before 2026-12-07: --seed)
            args.data_seed = DATA_SEED

    # -- parts -----------------------------------------------------------------------------------
    def load(self):
        a = self.args
        if a.task_type not in self.task_types:
            raise SwiftError(f"--task_type {a.task_type} is trained with `swift rlhf --rlhf_type rm|prm`; "
                             "sft/pt train causal_lm")
        dtype = resolve_dtype(a.torch_dtype)  # precision decided before DeepSpeed fills its "auto" values from it
        mixed_precision(a.training_args, dtype)
        a.training_args.enable_deepspeed()
        model, tokenizer, info = load_model(a.model, use_hf=a.use_hf, revision=a.model_revision,
                                            torch_dtype=a.torch_dtype, attn_impl=a.attn_impl, task_type=a.task_type,
                                            num_labels=a.num_labels, check_model=a.check_model,
                                            quantization=bnb_config(a))
        if a.training_args.gradient_checkpointing and not model.supports_gradient_checkpointing:
            logger.info(f"gradient checkpointing is off: {type(model).__name__} does not support it")
            a.training_args.gradient_checkpointing = False
        mixed_precision(a.training_args, model.dtype)
        if not torch.cuda.is_available():
            a.training_args.dataloader_pin_memory = False  # pinning needs an accelerator
        name = choose_template(a.template, a.model_type, info.model_type, tokenizer)
        if a.max_length is None:  # the model's context (args.json records it, packing and PRM steps read it)
            a.max_length = model_max_length(model.config)
        template = get_template(name, tokenizer, system=a.system, max_length=a.max_length,
                                truncation_strategy=a.truncation_strategy, loss_scale=a.loss_scale)
        logger.info(f"model {a.model} ({info.model_type}), template {name}")
        self.template = template
        return model, tokenizer, template, info

    def datasets(self, template) -> tuple[Any, Any, list[dict]]:
        """Return (train dataset, eval dataset or None, raw validation rows for generation eval)."""
        a = self.args
        seed = a.data_seed
        load = dict(column_map=a.data_args.column_map, strict=a.strict, seed=seed, use_hf=a.use_hf)
        if a.load_from_cache_file and not a.cached_dataset:
            logger.info("--load_from_cache_file: this version keeps no dataset cache; the rows are encoded now")
        if a.streaming:
            train = StreamingDataset(a.dataset, template, column_map=load["column_map"], strict=a.strict,
                                     use_hf=a.use_hf,
                                     prepare=lambda row: fill_identity([row], a.model_name, a.model_author))
            val_rows = load_rows(a.val_dataset, flag="--val_dataset", **load) if a.val_dataset else RowSet()
            fill_identity(val_rows.rows, a.model_name, a.model_author)  # as the training rows are
        elif a.cached_dataset:
            return self._cached(template, seed)
        else:
            train_rows, val_rows = read_rows(a.data_args, seed, a.use_hf)
            if a.lazy_tokenize:
                train = LazyDataset(train_rows, self.row_encoder(template), strict=a.strict)
                return train, self._val(val_rows, template), val_rows.rows
            samples = self.encode(train_rows, template, "encode train")
            train_rows.report("train dataset")
            if not samples:
                raise SwiftError("no training samples left after encoding; see the dropped-row report above")
            if a.packing:
                samples = pack(samples, a.max_length, seed)
                logger.info(f"packed into {len(samples)} rows of up to {a.max_length} tokens")
            train = ListDataset(samples)
        return train, self._val(val_rows, template), val_rows.rows

    def _cached(self, template, seed: int):
        """--cached_dataset: the encoded rows `swift export --to_cached_dataset` wrote, if this run's
        template encodes as theirs did (packed here with --packing, as encoded rows are)."""
        from datasets import concatenate_datasets

        from swift.dataset.cache import CachedRows, encoding_of, load_cache

        a = self.args
        encoding = encoding_of(template)
        trains, vals = zip(*(load_cache(folder, encoding, seed) for folder in a.cached_dataset))
        train = concatenate_datasets(list(trains))
        vals = [v for v in vals if v is not None]
        val = CachedRows(concatenate_datasets(vals)) if vals else None
        logger.info(f"cached dataset: {len(train)} train and {len(val) if val else 0} val rows, encoded already")
        if not len(train):
            raise SwiftError(f"--cached_dataset {' '.join(a.cached_dataset)}: no training rows")
        if a.packing:
            samples = pack(train.to_list(), a.max_length, seed)
            logger.info(f"packed into {len(samples)} rows of up to {a.max_length} tokens")
            return ListDataset(samples), val, []
        return CachedRows(train), val, []

    def _val(self, val_rows: RowSet, template):
        if not len(val_rows):
            return None
        val_samples = self.encode(val_rows, template, "encode val")
        why = val_rows.report("val dataset")
        if not val_samples:  # (HF would stop later, with a traceback, on an evaluation without data)
            raise SwiftError(f"validation data: none of its rows could be encoded ({why})")
        return ListDataset(val_samples)

    def row_encoder(self, template):
        """row -> training sample (raises RowError for a row that cannot be used)."""
        return template

    def encode(self, rowset: RowSet, template, desc: str) -> list[dict]:
        return encode_rows(rowset, self.row_encoder(template), strict=self.args.strict, desc=desc,
                           num_proc=self.args.dataset_num_proc)

    def collator(self, tokenizer, model):
        return (PaddingFreeCollator if self.args.padding_free else Collator)(tokenizer.pad_token_id, dtype=model.dtype)

    def trainer_kwargs(self, model) -> dict[str, Any]:
        """Extra keyword arguments for `trainer_cls` (e.g. a reference model)."""
        return {}

    # -- run -------------------------------------------------------------------------------------
    def build_trainer(self):
        """The model, data and trainer of this run, ready to train (kept as `self.trainer`)."""
        a = self.args
        if a.training_args.n_gpu > 1:  # HF would wrap the model in DataParallel, which splits our
            # `logits_to_keep` positions across the replicas (before 2026-12-07 the first step failed)
            n = a.training_args.n_gpu
            raise SwiftError(f"{n} GPUs are visible to one process: launch one process per GPU with "
                             f"NPROC_PER_NODE={n}, or pick one with CUDA_VISIBLE_DEVICES")
        set_seed(a.seed)
        check_specs(a.dataset)  # a missing file or unknown built-in: before the model loads
        check_specs(a.val_dataset, "--val_dataset")
        base = a.output_dir
        base_existed = os.path.isdir(base)
        out = resolve_output_dir(a)  # its checks (the checkpoint to resume, an earlier run) before the model loads
        try:
            model, tokenizer, template, info = self.load()
            train, val, val_rows = self.datasets(template)
            extra = self.trainer_kwargs(model)  # before the tuner wraps the model (a frozen copy may be taken)
            model = prepare_model(model, a.tuner_args, task_type=a.task_type)
        except BaseException:  # a version claimed for this run and still empty goes (no trail of empty vN-...)
            if a.add_version and _is_main() and os.path.isdir(out) and not os.listdir(out):
                os.rmdir(out)
                if not base_existed and os.path.isdir(base) and not os.listdir(base):
                    os.rmdir(base)  # made for this run only
            raise
        args_path = os.path.join(out, "args.json")
        if _is_main():
            # the base directory, so `--config args.json` repeats the run into a new version beside this one
            write_json(args_path, {**a.to_dict(), "output_dir": base})
            config = getattr(a, "config_file", None)
            copy = os.path.join(out, os.path.basename(config)) if config else None
            # args.json above already holds it all; a file already in the run's directory stays as it
            # is (before 2026-12-07: SameFileError, after the model had loaded)
            if config and os.path.basename(config) != "args.json" and not (
                    os.path.exists(copy) and os.path.samefile(config, copy)):
                shutil.copy(config, copy)
        with fsdp_on_cpu(a.training_args):
            trainer = self.trainer_cls(
                model=model, args=a.training_args, train_dataset=train, eval_dataset=val,
                data_collator=self.collator(tokenizer, model), processing_class=tokenizer,
                callbacks=[JsonlLogCallback(out), ArgsInCheckpointCallback(args_path)], **extra,
            )
        check_fsdp_ran(trainer)
        self.trainer = trainer
        for name in a.training_args.callbacks:
            trainer.add_callback(build_callback(name, trainer))
        if a.eval_use_evalscope:
            from swift.eval.callback import BenchmarkCallback

            trainer.add_callback(BenchmarkCallback(trainer, template, a.bench_args, a.training_args.eval_steps,
                                                   use_hf=a.use_hf, strict=a.strict))
        trainer.template = template
        trainer.generation_rows = val_rows
        if a.generation_max_length:
            trainer.generation_max_new_tokens = a.generation_max_length
        return trainer

    def run(self) -> dict[str, Any]:
        a = self.args
        trainer = self.build_trainer()
        out = a.output_dir
        resume = a.resume_from_checkpoint
        if resume == "last":
            resume = get_last_checkpoint(out)
        train_result = trainer.train(resume_from_checkpoint=resume)
        metrics = dict(train_result.metrics)
        if (trainer.eval_dataset is not None or (a.predict_with_generate and trainer.generation_rows)) \
                and not _evaluated_at(trainer):
            metrics.update(trainer.evaluate())
        else:
            metrics.update(_last_eval(trainer))
        trainer.save_model(out)
        save_whole_model(trainer, out)
        if hasattr(trainer, "evaluate_after_save"):  # e.g. --evaluate_on_neg_data: after the model is safe
            metrics.update(trainer.evaluate_after_save())
        if hasattr(trainer, "close"):
            trainer.close()  # e.g. an inference engine's processes
        if a.training_args.deepspeed:  # a later model loaded in this process must not be partitioned
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
        checksums = _rank_checksums(trainer.model)
        result = {
            "output_dir": out,
            "model_dir": out,
            # a node other than the first has no output directory of its own (only global rank 0 saves)
            "last_checkpoint": get_last_checkpoint(out) if os.path.isdir(out) else None,
            "best_checkpoint": trainer.state.best_model_checkpoint,
            "global_step": trainer.state.global_step,
            "metrics": metrics,
            "rank_checksums": checksums,
        }
        if _is_main():
            write_json(os.path.join(out, "result.json"), result)
        return result


def _check_resumable(checkpoint: str, given: str) -> None:
    """A checkpoint a run can go on from: HF's trainer state and the optimizer's. One saved with
    --save_only_model has neither optimizer, scheduler nor RNG state, and HF would restart the
    optimizer and the schedule silently (before 2026-12-07 it did); a run's final directory has no
    trainer state (a traceback after the model loaded)."""
    if not os.path.isdir(checkpoint):
        raise SwiftError(f"--resume_from_checkpoint {given}: no such checkpoint directory")
    names = os.listdir(checkpoint)
    if "trainer_state.json" not in names:
        raise SwiftError(f"--resume_from_checkpoint {given}: {checkpoint} is no checkpoint (no trainer_state.json); "
                         "give one of its checkpoint-N directories")
    if not any(n.startswith(("optimizer", "global_step")) for n in names):  # HF's, FSDP's and DeepSpeed's layouts
        raise SwiftError(f"--resume_from_checkpoint {given}: {checkpoint} holds no optimizer state (saved with "
                         "--save_only_model?): a run cannot go on from it; start a new run from its weights "
                         "with --model (full) or --adapters (LoRA)")


def _refuse_earlier_run(out: str) -> None:
    """--add_version false writes into --output_dir itself: an earlier run's checkpoints and log there
    would mix with this one's (its logging.jsonl appended to, `last` finding its checkpoints);
    before 2026-12-07 they did."""
    earlier = [n for n in (os.listdir(out) if os.path.isdir(out) else [])
               if n == "logging.jsonl" or re.fullmatch(r"checkpoint-\d+", n)]
    if earlier:
        raise SwiftError(f"--output_dir {out} already holds a run ({', '.join(sorted(earlier)[:3])}) and --add_version "
                         "false writes into it: give another --output_dir, --add_version true, or "
                         "--resume_from_checkpoint to go on with it")


VERSION_DIR = re.compile(r"v(\d+)-\d{8}-\d{6}$")


def resolve_output_dir(a) -> str:
    """With --add_version (the default, as in ms-swift) a run writes to
    <output_dir>/v<N>-<YYYYMMDD-HHMMSS>, N one more than the highest version already there, the
    directory claimed by rank 0 and its name shared with the other ranks, so they never race (and
    two jobs started together never share one). A resumed run continues in the directory of its
    checkpoint when that is a run under --output_dir (`last`: the newest such run with a
    checkpoint); a checkpoint from elsewhere starts a new version. Sets --output_dir to the run's
    directory."""
    base = a.output_dir
    resume = a.resume_from_checkpoint
    if not a.add_version:  # the run is --output_dir itself; `last` is its newest checkpoint
        if resume == "last":
            last = get_last_checkpoint(base) if os.path.isdir(base) else None
            if last is None:  # (before 2026-11-29 HF's lookup found none and the run started afresh)
                raise SwiftError(f"--resume_from_checkpoint last: {base} has no checkpoint")
            a.training_args.resume_from_checkpoint = last
            _check_resumable(last, "last")
        elif resume:
            _check_resumable(resume, resume)
        else:
            _refuse_earlier_run(base)
        return base
    run_dir = None
    if resume == "last":  # every rank checks, so a refusal stops them all
        runs = sorted(_versions(base), reverse=True)
        run_dir = next((os.path.join(base, d) for _, d in runs if get_last_checkpoint(os.path.join(base, d))), None)
        if run_dir is None:
            raise SwiftError(f"--resume_from_checkpoint last: no run under {base} has a checkpoint")
        _check_resumable(get_last_checkpoint(run_dir), "last")
    elif resume:
        _check_resumable(resume, resume)
        parent = os.path.dirname(os.path.abspath(resume))
        if os.path.dirname(parent) == os.path.abspath(base):
            run_dir = parent  # one of this --output_dir's runs: it goes on there
    if run_dir is None and _is_main():
        run_dir = _claim_version(base)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        shared = [run_dir]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir = shared[0]
    a.training_args.output_dir = run_dir  # TensorBoard's events follow it (<run>/runs/...)
    if _is_main():
        logger.info(f"this run writes to {run_dir}")
    return run_dir


def _claim_version(base: str) -> str:
    os.makedirs(base, exist_ok=True)
    n = max((n for n, _ in _versions(base)), default=-1) + 1
    while True:
        run_dir = os.path.join(base, f"v{n}-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.mkdir(run_dir)  # atomic: a job started in the same second takes the next number
            return run_dir
        except FileExistsError:
            n += 1


def _versions(base: str) -> list[tuple[int, str]]:
    if not os.path.isdir(base):
        return []
    return [(int(m.group(1)), d) for d in os.listdir(base) if (m := VERSION_DIR.match(d))]


def _last_eval(trainer) -> dict[str, float]:
    """The metrics of the most recent evaluation, merged across its log entries."""
    out: dict[str, float] = {}
    for entry in trainer.state.log_history:
        if any(k.startswith("eval_") for k in entry):
            if entry.get("step") != out.get("_step"):
                out = {"_step": entry.get("step")}
            out.update({k: v for k, v in entry.items() if k.startswith("eval_")})
    out.pop("_step", None)
    return out


def _evaluated_at(trainer) -> bool:
    # eval_reward: the online trainers' evaluation (sampled answers scored by the rewards)
    steps = [e.get("step") for e in trainer.state.log_history
             if "eval_loss" in e or "eval_acc" in e or "eval_reward" in e]
    return bool(steps) and steps[-1] == trainer.state.global_step


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _whole_bytes(p: torch.nn.Parameter) -> bytes:
    """A parameter's whole value: gathered from every rank under FSDP2 and ZeRO-3 (whose `p.data`
    is an empty placeholder: before 2026-12-07 the digest then held the names alone, so diverged
    ranks passed)."""
    if hasattr(p, "ds_id"):  # a ZeRO-3 partition; every rank gathers it, in the same order
        import deepspeed

        with deepspeed.zero.GatheredParameters([p]):
            return p.detach().float().cpu().numpy().tobytes()
    return whole(p).detach().float().cpu().numpy().tobytes()


def _rank_checksums(model: torch.nn.Module) -> list[str]:
    """A digest of the trainable weights on every rank; ranks that diverged make the run fail loudly."""
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            digest.update(name.encode())
            digest.update(_whole_bytes(p))
    mine = digest.hexdigest()[:16]
    if not dist.is_initialized():
        return [mine]
    gathered: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if len(set(gathered)) > 1:
        raise SwiftError(f"data-parallel ranks ended with different weights: {gathered}")
    return gathered


def sft_main(args: SftArguments | list[str] | None = None) -> dict[str, Any]:
    """Run `swift sft`; returns output dir, last/best checkpoint and final metrics."""
    return TrainPipeline(resolve_args(SftArguments, args, "swift sft")).run()


def pt_main(args: PtArguments | list[str] | None = None) -> dict[str, Any]:
    """Run `swift pt` (loss on every token, full tuning by default)."""
    return TrainPipeline(resolve_args(PtArguments, args, "swift pt")).run()
