"""Fitting a head to its sequences: a new head of a kind (or one to continue, `start_head`), AdamW with a
warm-up and a cosine decay, bf16 autocast where the machine runs it fast, and checkpoints every few minutes and
at each epoch's end that a run with the same data and settings resumes from. `frequent_tokens`: the draft
vocabulary, the tokens the answers hold most often."""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from ...api.errors import SpeculaError, unsafe_pickle
from ..config import HeadConfig
from ..eagle import EagleHead
from ..eagle3 import Eagle3Head, default_aux_layers
from ..medusa import MedusaHead
from .features import Sequence
from .frozen import Frozen
from .losses import eagle3_loss, eagle_loss, medusa_loss


def _read_checkpoint(path: Path, say: Callable[[str], None]) -> dict | None:
    """A checkpoint's tensors and numbers, read without running code from the file (weights_only): a
    file that holds anything else is ignored, with a notice, and training starts over."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # an unpickler error, a damaged file: all mean the same here
        say(f"training: the checkpoint {path} was not used ({type(exc).__name__}: {unsafe_pickle(exc)[:120]})")
        return None
    return state if isinstance(state, dict) else None


def _fast_bf16(device: torch.device) -> bool:
    """Whether training runs its products in bf16 (autocast, fp32 weights and optimizer): on a GPU, and on
    CPUs with bf16 instructions (AMX or AVX-512 BF16; 1.5x faster EAGLE-3 training than fp32 measured on
    one), where it is exact enough for a head that only proposes."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    from ...cpu.step import cpu_features

    flags = cpu_features().split()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _bf16_autocast(device: torch.device, on: bool):
    import contextlib
    import warnings

    if not on:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")  # bf16 rows, fp32 norm weights
    stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
    return stack


def train_head(target, seqs: list[Sequence], epochs: int = 2, lr: float = 1e-3, seed: int = 0,
               say: Callable[[str], None] = lambda s: None, batch: int = 4,
               checkpoint: Path | None = None, kind: str = "eagle",
               draft_ids: torch.Tensor | None = None, start: torch.nn.Module | None = None) -> torch.nn.Module:
    """Train a head of this kind on these sequences. With `checkpoint` the state is saved every few
    minutes and at the end of each epoch, and a run with the same data and settings resumes from it.
    `start`: a head of this kind for the target (`start_head`) to continue training, with its draft
    vocabulary, instead of a new one."""
    torch.manual_seed(seed)
    config = HeadConfig.for_target(target.model.config)
    frozen = Frozen(target)
    all_ids = torch.arange(frozen.lm.shape[0], device=frozen.device)
    if start is not None:
        head = start
    elif kind == "eagle3":  # its own LM head over the draft vocabulary, starting from the target's rows
        ids = draft_ids.to(frozen.device) if draft_ids is not None else all_ids
        config = replace(config, aux_layers=default_aux_layers(target.model.config.num_hidden_layers),
                         draft_vocab=int(ids.shape[0]))
        head = Eagle3Head(config)
        head.draft_ids = ids
        with torch.no_grad():
            head.lm.weight.copy_(frozen.lm[ids])
            head.final_norm.weight.copy_(frozen.norm_w)
    else:
        head = MedusaHead(config) if kind == "medusa" else EagleHead(config)
        if draft_ids is not None:
            head.draft_ids = draft_ids
        elif kind == "medusa":
            head.draft_ids = all_ids
    head.to(frozen.device)
    loss_of = {"medusa": medusa_loss, "eagle3": eagle3_loss}.get(kind, eagle_loss)
    mixed = kind == "eagle3" and _fast_bf16(frozen.device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    plan = []  # (epoch, the sequences of one optimizer step)
    for epoch in range(epochs):
        order = list(range(len(seqs)))
        rng.shuffle(order)
        plan += [(epoch, order[j : j + batch]) for j in range(0, len(order), batch)]
    total = len(plan)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / max(1, total))))
    key = {"sequences": len(seqs), "tokens": sum(int(s.tokens.shape[0]) for s in seqs), "epochs": epochs,
           "lr": lr, "seed": seed, "batch": batch, "kind": kind}
    if start is not None:  # a checkpoint of a new head's training is not this run's
        key["start"] = _weights_digest(start)
    done = 0
    state = _read_checkpoint(checkpoint, say) if checkpoint is not None and checkpoint.is_file() else None
    if state is not None:
        if state.get("key") == key:
            head.load_state_dict(state["head"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            done = state["step"]
            say(f"training: resuming at step {done}/{total}")

    def save(step: int) -> None:
        if checkpoint is not None:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"key": key, "head": head.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "step": step}, tmp)
            tmp.replace(checkpoint)

    right = seen = 0
    t0 = last_save = time.perf_counter()
    for step in range(done, total):
        epoch, group = plan[step]
        with _bf16_autocast(frozen.device, mixed):
            loss, r, n = loss_of(head, frozen, [seqs[j] for j in group])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        right, seen = right + r, seen + n
        end_of_epoch = step + 1 == total or plan[step + 1][0] != epoch
        if (step + 1) % 10 == 0 or end_of_epoch:
            eta = (time.perf_counter() - t0) / (step + 1 - done) * (total - step - 1)
            say(f"training: epoch {epoch + 1}/{epochs}, step {step + 1}/{total}, "
                f"top-1 {right / max(1, seen):.0%}, eta {eta:.0f} s")
        if end_of_epoch or time.perf_counter() - last_save > 120:
            save(step + 1)
            last_save = time.perf_counter()
        if end_of_epoch:
            right = seen = 0
    return head.eval()


def start_head(folder: Path, target, kind: str) -> tuple[torch.nn.Module, dict]:
    """The head in `folder` to continue training as a head of `kind` for this target (fp32, trainable) and
    what its training was; refused in one line where it is of another kind, or not one of Specula's own."""
    from ..store import load_head, read_info

    stored = "eagle" if kind == "eagle3" else kind
    info = read_info(folder)  # a folder without head.json: refused by check_options before the model loads
    reads_layers = bool(info.config.aux_layers)
    if info.kind != stored or (stored == "eagle" and reads_layers != (kind == "eagle3")):
        what = ("an EAGLE-3" if reads_layers else "an eagle") if info.kind == "eagle" else f"a {info.kind}"
        raise SpeculaError(f"{folder} holds {what} head: it cannot continue as --kind {kind}")
    head, _ = load_head(folder, target, dtype=torch.float32, kind=stored)  # a head for another model: said first
    if kind == "eagle3" and tuple(info.config.aux_layers) != default_aux_layers(target.model.config.num_hidden_layers):
        raise SpeculaError(f"{folder} reads target layers {list(info.config.aux_layers)}, not the ones training reads")
    return head.train().requires_grad_(True), dict(info.training)


def _weights_digest(head: torch.nn.Module) -> str:
    """A short digest of a head's weights: which head a checkpoint continued."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(head.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def frequent_tokens(seqs: list[Sequence], size: int) -> torch.Tensor:
    """The `size` token ids that occur most often in the answers (the head's draft vocabulary)."""
    counts = torch.zeros(int(max(int(s.tokens.max()) for s in seqs)) + 1, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.tokens[s.answer_start :], minlength=counts.shape[0])
    size = min(size, int((counts > 0).sum()))
    return counts.topk(size).indices.sort().values
