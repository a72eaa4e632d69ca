#!/usr/bin/python3
"""What a user would run instead of oobleck: GPT-2 from torch.nn trained by plain PyTorch.

Run with Debian's python3-torch (/usr/bin/python3); bench/vs_pytorch drives it beside
oobleck-local (issue 26). The model is tests/python/gpt2_reference.py's GPT2 (imported, not
copied): GPT-2 as Hugging Face defines it, the architecture oobleck's `gpt2` is checked against.

  vs_pytorch.py --mode single|ddp --nodes N --vocab V --d-model D --heads H --blocks L
                --seq-len T [--tied] --global-batch B --microbatch b --steps S --warmup W
                [--lr .. --beta1 .. --beta2 .. --eps .. --weight-decay .. --warmup-steps ..
                 --total-steps .. --min-lr .. --decay constant|linear|cosine --clip-norm ..]

  single: one process, one intra-op thread, B / b microbatches of b per step (gradient
          accumulation), then clipping (when --clip-norm > 0) and one AdamW update.
  ddp:    N processes (torch.multiprocessing, fork), DistributedDataParallel over gloo on
          127.0.0.1, one intra-op thread each; every process runs B / (b N) microbatches per step,
          the gradients all-reduced on the last one (no_sync() on the others, as users do).

The data are token windows drawn at random (vocabulary V, T + 1 tokens each) once before the
loop, not the job's corpus: the same shapes are the same work for the model. AdamW as oobleck
applies it: weight decay on matrices only (dim >= 2), the job's betas and eps, the learning rate
of the job's schedule set before every update (linear warm-up, then constant, linear or cosine
decay to min_lr).

Prints one JSON line: mode, nodes, steps, warmup, step_ms (mean wall time per step after the
first `warmup` steps, process 0's clock; in ddp every step ends in an all-reduce, so the
processes are in step), samples_per_s (B x measured steps / their wall time), cpu_per_wall (process
0's CPU time over those steps, all its threads, over their wall time: about 1 or less when it
computes on one thread, as it should) and the losses.
"""
import argparse
import json
import math
import os
import socket
import sys
import time

# One compute thread means one: torch.set_num_threads(1) does not reach the OpenBLAS pool that
# Debian's torch calls for matrix products, which otherwise runs them on every core (measured: the
# single loop at d_model 256 used ~1.6 of the 2 cores, and DDP's two processes four threads on two
# cores). OpenBLAS reads this when it loads, so it is set before torch is imported; oobleck's
# processes do the same through runtime::use_one_compute_thread.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import torch  # noqa: E402  (after the thread setting above)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from gpt2_reference import GPT2  # noqa: E402  (the reference model, unchanged)


def learning_rate(a, step):
    """The rate of the step-th update (1-based), as runtime::learning_rate computes it."""
    if a.warmup_steps > 0 and step <= a.warmup_steps:
        return a.lr * step / a.warmup_steps
    if a.decay == "constant":
        return a.lr
    span = a.total_steps - a.warmup_steps
    if span <= 0 or step >= a.total_steps:
        return a.min_lr
    progress = (step - a.warmup_steps) / span
    if a.decay == "linear":
        return a.lr + (a.min_lr - a.lr) * progress
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * progress))


def build(a):
    torch.manual_seed(a.seed)
    cfg = {"vocab_size": a.vocab, "n_positions": a.seq_len, "n_embd": a.d_model, "n_layer": a.blocks,
           "n_head": a.heads, "tie_word_embeddings": a.tied}
    model = GPT2(cfg)
    if a.tied:  # the head reads wte; its own matrix is unused (DDP refuses parameters without gradients)
        model.lm_head.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    plain = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    return model, opt


def windows(a, count, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, a.vocab, (count, a.seq_len + 1), generator=g)


def train(a, rank, world):
    """Trains a.steps steps; returns (per-step wall seconds, per-step CPU seconds of this process's
    threads, losses) as this process saw them."""
    torch.set_num_threads(1)
    model, opt = build(a)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    per_process = a.global_batch // world
    micro = per_process // a.microbatch
    # A pool of windows larger than one step's; step k takes its slice cyclically.
    pool = windows(a, max(4 * per_process, 64), 1000 + rank)
    times, cpus, losses = [], [], []
    for step in range(a.steps):
        if world > 1 and step == 0:
            dist.barrier()  # every process built and ready: the first step starts together
        t0, c0 = time.perf_counter(), time.process_time()
        for g in opt.param_groups:
            g["lr"] = learning_rate(a, step + 1)
        opt.zero_grad(set_to_none=False)
        total = torch.zeros(())
        for m in range(micro):
            begin = ((step * micro + m) * a.microbatch) % (pool.shape[0] - a.microbatch + 1)
            batch = pool[begin:begin + a.microbatch]
            x, y = batch[:, :-1], batch[:, 1:]
            last = m == micro - 1
            ctx = net.no_sync() if (world > 1 and not last) else _null()
            with ctx:
                logits = net(x)
                loss = F.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1)) / micro
                loss.backward()
            total += loss.detach()
        if a.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_norm)
        opt.step()
        losses.append(float(total))  # one host read per step
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return times, cpus, losses


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def ddp_worker(rank, a, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.nodes)
    try:
        result = train(a, rank, a.nodes)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["single", "ddp"], required=True)
    p.add_argument("--nodes", type=int, default=2, help="processes in ddp mode")
    for name in ("vocab", "d-model", "heads", "blocks", "seq-len", "global-batch", "microbatch", "steps"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the mean")
    p.add_argument("--tied", action="store_true", help="the LM head is the token embedding")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=0, help="of the learning-rate schedule")
    p.add_argument("--total-steps", type=int, default=1000, help="of the learning-rate schedule")
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--decay", choices=["constant", "linear", "cosine"], default="cosine")
    p.add_argument("--clip-norm", type=float, default=0.0)
    a = p.parse_args()
    world = a.nodes if a.mode == "ddp" else 1
    if a.nodes < 1:
        p.error("--nodes must be at least 1")
    if a.steps <= a.warmup:
        p.error("--warmup must be smaller than --steps")
    if a.d_model % a.heads:
        p.error("--d-model must be a multiple of --heads")
    if a.global_batch % (a.microbatch * world):
        p.error(f"--global-batch {a.global_batch} is not a multiple of microbatch x processes = {a.microbatch * world}")

    if a.mode == "single":
        times, cpus, losses = train(a, 0, 1)
    else:
        ctx = mp.get_context("fork")
        queue = ctx.SimpleQueue()
        procs = mp.start_processes(ddp_worker, args=(a, free_port(), queue), nprocs=a.nodes, join=False,
                                   start_method="fork")
        while not procs.join():  # raises when a process fails
            pass
        if queue.empty():
            sys.exit("error: process 0 reported nothing")
        times, cpus, losses = queue.get()
    measured = times[a.warmup:]
    step_ms = 1000.0 * sum(measured) / len(measured)
    cpu_per_wall = sum(cpus[a.warmup:]) / sum(measured)
    print(json.dumps({"mode": a.mode, "nodes": world, "steps": a.steps, "warmup": a.warmup, "step_ms": step_ms,
                      "samples_per_s": 1000.0 * a.global_batch / step_ms, "global_batch": a.global_batch,
                      "microbatch": a.microbatch, "threads_per_process": 1, "cpu_per_wall": cpu_per_wall,
                      "losses": losses}))


if __name__ == "__main__":
    main()
