"""`swift estimate`: how likely a model is to produce a rare target output, under a distribution of
inputs (Low Probability Estimation, Wu & Hilton, arXiv 2410.13211; the flags of the RePULSe fork).

An input is x = (x_1..x_K), each token drawn independently from its position's distribution D_k.
The event is f(x) = P(target tokens | x) (teacher-forced), or with --use_argmax the indicator that
greedy decoding from x yields the target. The methods estimate p = E_{x~D}[f(x)]:

- bruteforce: mean of f over samples of D.
- itgis (independent token gradient importance sampling): batch i draws x_k ~ q_k ∝ p_k·exp(S_k/T_i)
  with T_0 = 1, T_i = T·(1−γ^i)/(1−γ); estimate = mean of w·f with w = Π p_k(x_k)/q_k(x_k); after
  each batch S ← γS + the batch mean of ∂s/∂onehot(x), s = the first target token's logit.
- mhis (Metropolis–Hastings importance sampling): chains on π(x) ∝ D(x)·e^{s(x)/T}, each step
  re-drawing one position from φ_x(v) ∝ p_k(v)·e^{∂s/∂onehot(x)_k[v]/T}; after burn-in
  p̂ = mean(f·e^{−s/T}) / mean(e^{−s/T}).
- exact: the sum over every input (spaces up to 2^24 inputs): the ground truth the others are
  checked against.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from tqdm import tqdm

from swift.arguments.base import ComposedArguments
from swift.arguments.model import ModelArguments
from swift.pipelines.base import resolve_args
from swift.safety.model import (AdapterArguments, check_causal_lm, load_studied_model, special_ids,
                                studied_template)
from swift.utils.io import write_json
from swift.utils.registry import SwiftError

METHODS = ("itgis", "mhis", "bruteforce", "exact")
DISTRIBUTIONS = ("hex", "uniform")
HEX_CHARS = "0123456789abcdefABCDEF"
MAX_EXACT_INPUTS = 2 ** 24


@dataclass
class EstimateOptions:
    target_word: str | None = field(default=None, metadata={
        "help": "The rare output: text whose tokens (one or several) follow the input."})
    method: str = field(default="itgis", metadata={"help": "itgis, mhis, bruteforce or exact (enumeration)."})
    distribution_name: str = field(default="hex", metadata={
        "help": "Input tokens: hex (the single-token encodings of 0-9a-fA-F, with and without a leading "
                "space) or uniform (every non-special token)."})
    distribution_file: str | None = field(default=None, metadata={
        "help": "JSON input distribution instead: {\"token_ids\" or \"tokens\": [...], \"probs\": [...]} for "
                "every position, or a list of them, one per position."})
    sequence_length: int | None = field(default=None, metadata={
        "help": "Input tokens K (default 10, or the positions --distribution_file lists)."})
    temperature: float = field(default=1.0, metadata={"help": "itgis/mhis: the importance temperature T."})
    n_samples: int = field(default=2 ** 16, metadata={"help": "Samples (mhis: after burn-in, all chains together)."})
    batch_size: int = field(default=256, metadata={"help": "Inputs per forward (mhis: the number of chains)."})
    itgis_decay_rate: float = field(default=0.9, metadata={"help": "itgis: γ, the decay of the gradient scores."})
    mhis_burn_in: int = field(default=1024, metadata={"help": "mhis: steps of every chain discarded first."})
    use_argmax: bool = field(default=False, metadata={
        "help": "The event is greedy decoding producing the target (default: its probability)."})
    goal: str | None = field(default=None, metadata={
        "help": "Put the random tokens in a chat turn after this request (the model's chat template; the "
                "target is then the start of the answer; the tokens follow the goal directly). Default: the "
                "tokens alone, as LPE."})
    template: str | None = field(default=None, metadata={"help": "--goal: the chat template (inferred when omitted)."})
    system: str | None = field(default=None, metadata={"help": "--goal: the system prompt."})
    seed: int = field(default=42, metadata={"help": "Sampling seed."})
    output_file: str | None = field(default=None, metadata={"help": "Also write the result JSON here (a new file)."})

    def __post_init__(self) -> None:
        if not self.target_word:
            raise SwiftError("--target_word is required: the output whose probability is estimated")
        if self.method not in METHODS:
            raise SwiftError(f"--method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.distribution_name not in DISTRIBUTIONS:
            raise SwiftError(f"--distribution_name {self.distribution_name!r} is not one of {', '.join(DISTRIBUTIONS)}")
        if self.distribution_file and not os.path.isfile(self.distribution_file):
            raise SwiftError(f"--distribution_file {self.distribution_file} does not exist")
        for name in ("n_samples", "batch_size"):
            if getattr(self, name) < 1:
                raise SwiftError(f"--{name} must be at least 1")
        if self.sequence_length is not None and self.sequence_length < 1:
            raise SwiftError("--sequence_length must be at least 1")
        if self.temperature <= 0:
            raise SwiftError("--temperature must be positive")
        if not 0 < self.itgis_decay_rate < 1:
            raise SwiftError("--itgis_decay_rate must lie in (0, 1)")
        if self.mhis_burn_in < 0:
            raise SwiftError("--mhis_burn_in must be at least 0")
        if (self.template or self.system) and self.goal is None:
            raise SwiftError("--template and --system are read only with --goal")
        if self.distribution_file and self.distribution_name != "hex":
            raise SwiftError(f"--distribution_name {self.distribution_name} is not read with --distribution_file "
                             "(the file gives the input tokens)")
        if self.method == "itgis" and self.n_samples <= self.batch_size:
            raise SwiftError(f"--n_samples {self.n_samples} <= --batch_size {self.batch_size} with --method itgis: "
                             "its first batch samples the plain input distribution and only later batches are steered "
                             "by the gradients (--temperature, --itgis_decay_rate), so this is brute force; give "
                             "--n_samples above --batch_size")
        # the flags of the other methods change nothing: refuse them
        unread = {"bruteforce": ("temperature", "itgis_decay_rate", "mhis_burn_in"),
                  "itgis": ("mhis_burn_in",), "mhis": ("itgis_decay_rate",),
                  "exact": ("temperature", "itgis_decay_rate", "mhis_burn_in", "n_samples", "seed")}[self.method]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        changed = next((name for name in unread if getattr(self, name) != defaults[name]), None)
        if changed:
            raise SwiftError(f"--{changed} is not read by --method {self.method}")
        if self.output_file and os.path.exists(self.output_file):
            raise SwiftError(f"--output_file {self.output_file} exists; give a new file (results are never overwritten)")


class EstimateArguments(ComposedArguments):
    """`swift estimate`: the probability of a rare target output under a distribution of inputs."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "adapter_args": AdapterArguments,
        "estimate_args": EstimateOptions,
    }
    aliases: ClassVar[dict[str, str]] = {"pretrain": "model"}  # the fork's name of the model flag

    def __post_init__(self) -> None:
        check_causal_lm(self)
        if self.model_type is not None and self.goal is None:
            raise SwiftError("--model_type is read only with --goal (it chooses the chat template; without --goal "
                             "the tokens are read alone)")


@dataclass
class InputDistribution:
    """Independent per-position token distributions, padded to one matrix: `ids` (K, M) token ids and
    `logp` (K, M) their log-probabilities (−inf on padding)."""

    ids: torch.Tensor
    logp: torch.Tensor

    @property
    def length(self) -> int:
        return self.ids.shape[0]

    def sample(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """(n, K) indices into each position's support."""
        return torch.multinomial(self.logp.exp(), n, replacement=True, generator=gen).T

    def tokens(self, idx: torch.Tensor) -> torch.Tensor:
        return self.ids.gather(1, idx.T).T

    def log_prob(self, idx: torch.Tensor) -> torch.Tensor:
        return self.logp.gather(1, idx.T).T.sum(-1)


def single_tokens(tokenizer, texts) -> list[int]:
    """The ids of the texts that encode as exactly one token (others are skipped), without repeats."""
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    return list(dict.fromkeys(i[0] for i in ids if len(i) == 1))


def named_distribution(name: str, tokenizer, vocab_size: int) -> list[int]:
    if name == "hex":
        return single_tokens(tokenizer, [c for ch in HEX_CHARS for c in (ch, " " + ch)])
    special = special_ids(tokenizer)
    return [i for i in range(min(len(tokenizer), vocab_size)) if i not in special]


def file_distribution(path: str, tokenizer, vocab_size: int) -> list[tuple[list[int], list[float] | None]]:
    """[(token ids, probs or None)] per position listed in the file (one entry: every position).
    Tokens of weight 0 are left out (they are never drawn)."""
    try:
        data = json.load(open(path, encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SwiftError(f"--distribution_file {path}: not readable JSON ({e})") from None
    entries = data if isinstance(data, list) else [data]
    if not entries:
        raise SwiftError(f"--distribution_file {path}: an empty list (give one entry per position, or one for all)")
    return [_position(entry, f"--distribution_file {path}, position {k}", tokenizer, vocab_size)
            for k, entry in enumerate(entries)]


def _position(entry, where: str, tokenizer, vocab_size: int) -> tuple[list[int], list[float] | None]:
    if not isinstance(entry, dict) or ("token_ids" in entry) == ("tokens" in entry):
        raise SwiftError(f"{where}: give an object with \"token_ids\" or \"tokens\" (and optionally \"probs\")")
    listed = entry.get("tokens", entry.get("token_ids"))
    if not isinstance(listed, list) or not listed:
        raise SwiftError(f"{where}: \"tokens\"/\"token_ids\" must be a non-empty list")
    ids = []
    for item in listed:
        if "tokens" in entry:
            enc = tokenizer.encode(item, add_special_tokens=False) if isinstance(item, str) else []
            if len(enc) != 1:
                raise SwiftError(f"{where}: {item!r} is not one token")
            ids.append(enc[0])
        elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < vocab_size:
            ids.append(item)
        else:
            raise SwiftError(f"{where}: token id {item!r} is not an integer in 0..{vocab_size - 1}")
    if len(set(ids)) != len(ids):
        raise SwiftError(f"{where}: a token is listed twice")
    probs = entry.get("probs")
    if probs is None:
        return ids, None
    if (not isinstance(probs, list) or len(probs) != len(ids)
            or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0
                       for p in probs) or sum(probs) <= 0):
        raise SwiftError(f"{where}: \"probs\" needs one finite non-negative number per token, not all zero")
    kept = [(i, p) for i, p in zip(ids, probs) if p > 0]
    return [i for i, _ in kept], [p for _, p in kept]


def build_distribution(a, tokenizer, vocab_size: int, device) -> InputDistribution:
    if a.distribution_file:
        positions = file_distribution(a.distribution_file, tokenizer, vocab_size)
        if len(positions) > 1 and a.sequence_length not in (None, len(positions)):
            raise SwiftError(f"--sequence_length {a.sequence_length}: --distribution_file {a.distribution_file} "
                             f"lists {len(positions)} positions")
        if len(positions) == 1:
            positions = positions * (a.sequence_length or 10)
    else:
        ids = named_distribution(a.distribution_name, tokenizer, vocab_size)
        if not ids:
            raise SwiftError(f"--distribution_name {a.distribution_name}: this tokenizer has none of its tokens")
        positions = [(ids, None)] * (a.sequence_length or 10)
    width = max(len(ids) for ids, _ in positions)
    ids = torch.zeros(len(positions), width, dtype=torch.long)
    logp = torch.full((len(positions), width), -math.inf, dtype=torch.float64)
    for k, (tokens, probs) in enumerate(positions):
        weights = torch.tensor(probs if probs is not None else [1.0] * len(tokens), dtype=torch.float64)
        ids[k, :len(tokens)] = torch.tensor(tokens)
        logp[k, :len(tokens)] = (weights / weights.sum()).log()
    return InputDistribution(ids.to(device), logp.to(device))


class Event:
    """Evaluates inputs: log f(x) (−inf where f = 0), the score s(x) (the first target token's logit)
    and, when asked, ∂s/∂(input embeddings) of the K input positions. The model reads
    `before` + x + `after` (a chat turn around the tokens with --goal; empty otherwise)."""

    def __init__(self, model, target_ids: list[int], use_argmax: bool, before: list[int] = (), after: list[int] = ()):
        self.model = model
        self.embed = model.get_input_embeddings()
        device = self.embed.weight.device
        self.target = torch.tensor(target_ids, device=device)
        self.before = torch.tensor(list(before), dtype=torch.long, device=device)
        self.after = torch.tensor(list(after), dtype=torch.long, device=device)
        self.use_argmax = use_argmax
        self.evaluations = 0

    def __call__(self, x: torch.Tensor, grad: bool = False):
        n, k = x.shape
        start, end = len(self.before), len(self.before) + k  # where x sits
        inputs = torch.cat([self.before.expand(n, -1), x, self.after.expand(n, -1), self.target[:-1].expand(n, -1)],
                           dim=1)  # the target teacher-forced
        with torch.no_grad():
            emb = self.embed(inputs)
        emb.requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            first = end + len(self.after) - 1  # the position that predicts the first target token
            logits = self.model(inputs_embeds=emb, use_cache=False).logits[:, first:].float()
            score = logits[:, 0, self.target[0]]
            emb_grad = torch.autograd.grad(score.sum(), emb)[0][:, start:end] if grad else None
        with torch.no_grad():
            if self.use_argmax:
                hit = (logits.argmax(-1) == self.target).all(-1)
                log_f = torch.where(hit, 0.0, -math.inf).double()
            else:
                log_f = logits.log_softmax(-1).gather(-1, self.target.expand(n, -1)[..., None])[..., 0].double().sum(-1)
        self.evaluations += n
        return log_f, score.detach().double(), emb_grad

    def onehot_grad(self, emb_grad: torch.Tensor) -> torch.Tensor:
        """∂s/∂onehot: the embedding gradient against every row of the embedding matrix (..., V)."""
        return emb_grad.float() @ self.embed.weight.float().T


def _mean_and_error(values: torch.Tensor) -> tuple[float, float]:
    n = values.numel()
    mean = values.mean().item()
    return mean, (values.std().item() / math.sqrt(n) if n > 1 else float("nan"))


def _batches(total: int, size: int):
    for start in range(0, total, size):
        yield min(size, total - start)


def bruteforce(event: Event, dist: InputDistribution, a, gen, bar) -> dict:
    values = []
    for n in _batches(a.n_samples, a.batch_size):
        log_f, _, _ = event(dist.tokens(dist.sample(n, gen)))
        values.append(log_f.exp())
        bar.update(n)
    estimate, error = _mean_and_error(torch.cat(values))
    return {"estimate": estimate, "std_error": error}


def itgis(event: Event, dist: InputDistribution, a, gen, bar) -> dict:
    scores = torch.zeros_like(dist.logp)  # S, on each position's support
    values = []
    for i, n in enumerate(_batches(a.n_samples, a.batch_size)):
        temp = 1.0 if i == 0 else a.temperature * (1 - a.itgis_decay_rate ** i) / (1 - a.itgis_decay_rate)
        logq = (dist.logp + scores / temp).log_softmax(-1)
        idx = torch.multinomial(logq.exp(), n, replacement=True, generator=gen).T
        log_w = (dist.logp - logq).gather(1, idx.T).T.sum(-1)
        log_f, _, emb_grad = event(dist.tokens(idx), grad=True)
        values.append((log_w + log_f).exp())
        step = event.onehot_grad(emb_grad.mean(0)).double().gather(1, dist.ids)  # (K, M)
        scores = a.itgis_decay_rate * scores + step
        bar.update(n)
    estimate, error = _mean_and_error(torch.cat(values))
    return {"estimate": estimate, "std_error": error}


def mhis(event: Event, dist: InputDistribution, a, gen, bar) -> dict:
    chains, temp = a.batch_size, a.temperature
    rows = torch.arange(chains, device=dist.ids.device)

    def proposal(emb_grad, pos):  # log φ_x over the support of each chain's chosen position
        g = event.onehot_grad(emb_grad[rows, pos]).double().gather(1, dist.ids[pos])
        return (dist.logp[pos] + g / temp).log_softmax(-1)

    idx = dist.sample(chains, gen)
    log_f, score, emb_grad = event(dist.tokens(idx), grad=True)
    bar.update(chains)
    kept_f, kept_s, accepted = [], [], 0
    steps = math.ceil(a.n_samples / chains)
    for step in range(a.mhis_burn_in + steps):
        pos = torch.randint(0, dist.length, (chains,), generator=gen, device=gen.device)
        forward = proposal(emb_grad, pos)
        new = torch.multinomial(forward.exp(), 1, generator=gen)[:, 0]
        old = idx[rows, pos]
        proposed = idx.clone()
        proposed[rows, pos] = new
        log_f2, score2, emb_grad2 = event(dist.tokens(proposed), grad=True)
        backward = proposal(emb_grad2, pos)
        log_accept = ((score2 - score) / temp + dist.logp[pos, new] - dist.logp[pos, old]
                      + backward[rows, old] - forward[rows, new])
        take = torch.rand(chains, generator=gen, device=gen.device, dtype=torch.float64).log() < log_accept
        idx = torch.where(take[:, None], proposed, idx)
        log_f, score = torch.where(take, log_f2, log_f), torch.where(take, score2, score)
        emb_grad = torch.where(take[:, None, None], emb_grad2, emb_grad)
        if step >= a.mhis_burn_in:
            kept_f.append(log_f)
            kept_s.append(score)
            accepted += int(take.sum())
        bar.update(chains)
    log_f, inv = torch.cat(kept_f), -torch.cat(kept_s) / temp
    estimate = math.exp(torch.logsumexp(log_f + inv, 0) - torch.logsumexp(inv, 0))
    return {"estimate": estimate, "std_error": None, "acceptance_rate": accepted / (steps * chains)}


def enumerate_inputs(dist: InputDistribution, batch_size: int):
    """Every input of the distribution's support, in batches of (indices, token ids)."""
    sizes = [int(torch.isfinite(row).sum()) for row in dist.logp]
    total = math.prod(sizes)
    for start in range(0, total, batch_size):
        flat = torch.arange(start, min(start + batch_size, total), device=dist.ids.device)
        idx = torch.empty(len(flat), dist.length, dtype=torch.long, device=flat.device)
        for k in range(dist.length - 1, -1, -1):  # mixed-radix digits: the last position varies fastest
            idx[:, k] = flat % sizes[k]
            flat = flat // sizes[k]
        yield idx, dist.tokens(idx)


def greedy_counts(model, dist: InputDistribution, batch_size: int = 8192) -> torch.Tensor:
    """How many inputs of the (enumerable) support make each token the greedy next token: the
    exact argmax events, from which the rare ones can be picked."""
    counts = None
    with torch.no_grad():
        for _, x in enumerate_inputs(dist, batch_size):
            top = model(input_ids=x).logits[:, -1].argmax(-1)
            step = torch.bincount(top, minlength=model.get_input_embeddings().weight.shape[0])
            counts = step if counts is None else counts + step
    return counts


def exact(event: Event, dist: InputDistribution, a, gen, bar) -> dict:
    sizes = [int(torch.isfinite(row).sum()) for row in dist.logp]
    total = math.prod(sizes)
    if total > MAX_EXACT_INPUTS:
        raise SwiftError(f"--method exact: {total:.3g} inputs ({' x '.join(map(str, sizes))}); enumeration stops at "
                         f"2^24: use itgis, mhis or bruteforce")
    parts = []
    for idx, x in enumerate_inputs(dist, a.batch_size):
        log_f, _, _ = event(x)
        parts.append(dist.log_prob(idx) + log_f)
        bar.update(len(idx))
    return {"estimate": math.exp(torch.logsumexp(torch.cat(parts), 0)), "std_error": 0.0}


ESTIMATORS: dict[str, Callable] = {"bruteforce": bruteforce, "itgis": itgis, "mhis": mhis, "exact": exact}


def estimate(model, tokenizer, a) -> dict[str, Any]:
    """Run --method on a loaded model; the result as a JSON-ready dict."""
    target_ids = tokenizer.encode(a.target_word, add_special_tokens=False)
    if not target_ids:
        raise SwiftError(f"--target_word {a.target_word!r} encodes to no tokens")
    vocab = model.get_input_embeddings().weight.shape[0]
    device = model.get_input_embeddings().weight.device
    dist = build_distribution(a, tokenizer, vocab, device)
    gen = torch.Generator(device=device).manual_seed(a.seed)
    before, after = chat_turn(model, tokenizer, a) if a.goal is not None else ([], [])
    event = Event(model, target_ids, a.use_argmax, before, after)
    total = a.n_samples
    if a.method == "exact":
        total = math.prod(int(torch.isfinite(row).sum()) for row in dist.logp)
    elif a.method == "mhis":  # every chain's first state, burn-in and kept steps
        total = a.batch_size * (1 + a.mhis_burn_in + math.ceil(a.n_samples / a.batch_size))
    started = time.perf_counter()
    with tqdm(total=total, desc=f"estimate ({a.method})", unit="input", dynamic_ncols=True) as bar:
        result = ESTIMATORS[a.method](event, dist, a, gen, bar)
    p = result["estimate"]
    return {"method": a.method, **result, "log10_estimate": math.log10(p) if p > 0 else None,
            "samples": event.evaluations, "seconds": round(time.perf_counter() - started, 3),
            "target_word": a.target_word, "target_ids": target_ids, "use_argmax": a.use_argmax, "goal": a.goal,
            "distribution": a.distribution_file or a.distribution_name, "sequence_length": dist.length,
            "support_sizes": [int(torch.isfinite(row).sum()) for row in dist.logp],
            "temperature": a.temperature, "n_samples": a.n_samples, "batch_size": a.batch_size, "seed": a.seed}


def chat_turn(model, tokenizer, a) -> tuple[list[int], list[int]]:
    """Token ids before and after the random tokens: the user turn "<goal><tokens>" and the
    generation prompt, in the model's chat template."""
    from swift.safety.attack import Prompter

    model_type = getattr(model.config, "model_type", None)
    template = studied_template(a, model_type, tokenizer)
    return Prompter(model, tokenizer, template).split_ids(a.goal)


def estimate_main(args: EstimateArguments | list[str] | None = None) -> dict[str, Any]:
    a = resolve_args(EstimateArguments, args, "swift estimate")
    model, tokenizer, _ = load_studied_model(a)
    result = {**estimate(model, tokenizer, a), "model": a.model, "adapters": list(a.adapters)}
    if a.output_file:
        write_json(a.output_file, result)
    print(json.dumps(result))
    return result
