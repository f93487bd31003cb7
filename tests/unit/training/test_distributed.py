"""Data parallelism with two CPU processes (gloo): the negatives span both ranks, two ranks with half a batch each
make exactly the update of one process with the whole batch, and a gradient missing on one rank counts as zero."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sentcl.model.encoder import Encoder
from sentcl.training.distributed import all_reduce_gradients, rank_share
from sentcl.training.losses import nt_xent, sup_simcse
from sentcl.training.trainer import Trainer
from tests.tiny import make_tiny_encoder, tiny_sentences, train_config

TEXTS = tiny_sentences(32, seed=2)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 4)) for i in range(0, 20, 2)]
# bf16 false: the ranks are compared with one process at fp32 tolerances, so the arithmetic is pinned to fp32
# whatever `train.bf16: auto` picks on this CPU (bf16 on CPUs with native bf16).
CONFIG = {"mode": "transfer", "views": ("none", "none"), "batch_size": 8, "lr": 1e-3, "device": "cpu",
          "warmup_ratio": 0, "steps": 2, "bf16": False}  # fmt: skip


def worker(rank: int, world: int, init_file: str, model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # The losses: every rank scores its own anchors against the gathered batch.
        torch.manual_seed(0)
        z1, z2, z3 = (torch.randn(8, 5) for _ in range(3))
        mine = slice(rank * 4, rank * 4 + 4)
        results = {}
        for name, fn, inputs in [
            ("nt_xent", lambda a, b, c: nt_xent(a, b, 0.1), (z1, z2, z3)),
            ("sup_simcse", lambda a, b, c: sup_simcse(a, b, c, 0.05), (z1, z2, z3)),
        ]:
            local = [x[mine].clone().requires_grad_() for x in inputs]
            loss = fn(*local)
            loss.backward()
            value = loss.detach().clone()
            dist.all_reduce(value)
            results[name] = (value / world, [x.grad for x in local])
        # Training: two steps of the real trainer, half of each batch per rank.
        encoder = Encoder.from_pretrained(model_dir)
        trainer = Trainer(encoder, train_config(**CONFIG), TEXTS, DEV, progress=False)
        for step in range(2):
            trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
        results["weights"] = {k: v.clone() for k, v in encoder.model.state_dict().items()}
        # A parameter that one rank's loss never reaches (BERT's pooler, a head) has no gradient there.
        used, unused = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
        used.grad = torch.full((2,), float(rank + 1))
        unused.grad = torch.ones(3) if rank == 0 else None
        all_reduce_gradients([used, unused], world)
        results["reduced"] = (used.grad, unused.grad)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_process_with_the_whole_batch(tmp_path):
    model_dir = str(make_tiny_encoder(tmp_path, dropout=0.0))
    mp.spawn(worker, args=(2, str(tmp_path / "init"), model_dir, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    torch.manual_seed(0)
    z = [torch.randn(8, 5).requires_grad_() for _ in range(3)]
    for name, fn in [
        ("nt_xent", lambda a, b, c: nt_xent(a, b, 0.1)),
        ("sup_simcse", lambda a, b, c: sup_simcse(a, b, c, 0.05)),
    ]:
        for x in z:
            x.grad = None
        loss = fn(*z)
        loss.backward()
        for rank in range(2):
            value, grads = ranks[rank][name]
            torch.testing.assert_close(value, loss.detach())  # the mean over ranks is the global loss
            for x, g in zip(z, grads, strict=True):
                if x.grad is None:  # an input the loss does not use
                    assert g is None
                    continue
                # Each rank's gradient covers all ranks' anchors; DDP's averaging divides by the world size.
                torch.testing.assert_close(g / 2, x.grad[rank * 4 : rank * 4 + 4], atol=1e-6, rtol=1e-5)

    encoder = Encoder.from_pretrained(model_dir)
    trainer = Trainer(encoder, train_config(**CONFIG), TEXTS, DEV, progress=False)
    for step in range(2):
        trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
    single = encoder.model.state_dict()
    for key, value in single.items():
        torch.testing.assert_close(ranks[0]["weights"][key], value, atol=1e-5, rtol=0, msg=key)
        assert torch.equal(ranks[0]["weights"][key], ranks[1]["weights"][key])  # the ranks stay in sync

    for rank in range(2):  # the mean over ranks, a missing gradient as zero
        used, unused = ranks[rank]["reduced"]
        assert torch.equal(used, torch.full((2,), 1.5)) and torch.equal(unused, torch.full((3,), 0.5))


def test_each_rank_takes_its_contiguous_share_of_the_global_batch():
    batch = [7, 3, 9, 1, 4, 8]
    assert [rank_share(batch, rank, 2) for rank in range(2)] == [[7, 3, 9], [1, 4, 8]]
    assert [rank_share(batch, rank, 3) for rank in range(3)] == [[7, 3], [9, 1], [4, 8]]
    assert rank_share(batch, 0, 1) == batch
