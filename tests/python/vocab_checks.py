"""Rank functions for test_vocab_layers.py (run by launcher.run on every rank): the
vocabulary-parallel modules against torch's own functions on the full tables, float64."""

import torch
import torch.nn.functional as F

import tp

# (vocab, hidden, pad_to_multiple_of): uneven slices, padding, and (vocab 3 at world 4)
# a rank that owns nothing.
CASES = [(37, 12, 1), (37, 12, 8), (3, 5, 1), (5, 5, 4)]
TOKENS = 7


def _data(vocab, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * 2
    x = torch.randn(TOKENS, hidden, generator=g, dtype=torch.float64)
    ids = torch.randint(0, vocab, (TOKENS,), generator=g)
    ids[0] = vocab - 1  # the last token sits next to the padding
    target = torch.randint(0, vocab, (TOKENS,), generator=g)
    target[1] = -100  # an ignored row
    upstream = torch.randn(TOKENS, hidden, generator=g, dtype=torch.float64)
    return w, x, ids, target, upstream


def _local_rows(full, partition, rank):
    begin, end = partition.range(rank)
    rb, re = partition.real(rank)
    out = torch.zeros(end - begin, full.shape[1], dtype=full.dtype)
    out[: re - rb] = full[rb:re]
    return out


def _err(a, b):
    return (a - b).abs().max().item() if a.numel() else 0.0


def check_all(rank, world):
    """Max errors per check name on this rank (0 or tiny), and the messages of the expected errors."""
    errs, messages = {}, {}
    for vocab, hidden, pad in CASES:
        name = f"v{vocab}h{hidden}p{pad}"
        w, x, ids, target, upstream = _data(vocab, hidden, vocab * 100 + pad)
        ckpt = {"embed.weight": w, "head.weight": w}

        # Embedding: forward and weight gradient, mirrored and sequence-parallel.
        for sp in (False, True):
            embed = tp.VocabParallelEmbedding(vocab, hidden, pad_to_multiple_of=pad, sequence_parallel=sp,
                                              dtype=torch.float64)
            embed.load_weights(ckpt, "embed")
            leaf = w.clone().requires_grad_(True)
            want = F.embedding(ids, leaf)
            (want * upstream).sum().backward()
            y = embed(ids)
            if sp:
                b, e = tp.sequence_ranges(TOKENS, world)[rank]
                want, up = want[b:e], upstream[b:e]
            else:
                up = upstream
            (y * up).sum().backward()
            errs[f"{name} embed sp={sp} forward"] = _err(y.detach(), want.detach())
            errs[f"{name} embed sp={sp} grad"] = _err(embed.weight.grad, _local_rows(leaf.grad, embed.partition, rank))
            assert [n for n, _ in embed.named_parameters()] == ["weight"]

        # Head: local logits (padding -inf), gathered logits, argmax.
        head = tp.ParallelLMHead(hidden, vocab, pad_to_multiple_of=pad, dtype=torch.float64)
        gathered = tp.ParallelLMHead(hidden, vocab, pad_to_multiple_of=pad, gather_output=True, dtype=torch.float64)
        head.load_weights(ckpt, "head")
        gathered.load_weights(ckpt, "head")
        want = F.linear(x, w)
        local = head(x)
        (b, e), (rb, re) = head.local_range(), head.vocab_range()
        assert local.shape == (TOKENS, e - b), local.shape
        errs[f"{name} head local"] = _err(local[:, : re - rb], want[:, rb:re])
        errs[f"{name} head padding is -inf"] = float(not bool(torch.all(local[:, re - rb:] == float("-inf"))))
        errs[f"{name} head gathered"] = _err(gathered(x), want)
        errs[f"{name} argmax"] = float(not torch.equal(head.argmax(local), want.argmax(-1)))
        # Saving: tp.gather_weights gives the whole tables back, padding left out.
        saved = tp.gather_weights(torch.nn.ModuleDict({"embed": embed, "head": head}))
        errs[f"{name} gather_weights names"] = float(sorted(saved) != ["embed.weight", "head.weight"])
        errs[f"{name} gather_weights"] = max(_err(saved["embed.weight"], w), _err(saved["head.weight"], w))

        # Cross entropy, untied and tied: loss, dL/dx, dL/dW.
        for tied in (False, True):
            w_leaf = w.clone().requires_grad_(True)
            x_leaf = x.clone().requires_grad_(True)
            h_ref = x_leaf + F.embedding(ids, w_leaf) if tied else x_leaf
            ref = F.cross_entropy(F.linear(h_ref, w_leaf), target, reduction="none", ignore_index=-100)
            ref.sum().backward()
            embed = tp.VocabParallelEmbedding(vocab, hidden, pad_to_multiple_of=pad, dtype=torch.float64)
            embed.load_weights(ckpt, "embed")
            if tied:
                lm = tp.ParallelLMHead.tied(embed)
                assert lm.weight is embed.weight
                params = list(torch.nn.ModuleList([embed, lm]).parameters())
                assert len(params) == 1, len(params)
            else:
                lm = tp.ParallelLMHead(hidden, vocab, pad_to_multiple_of=pad, dtype=torch.float64)
                lm.load_weights(ckpt, "head")
            xt = x.clone().requires_grad_(True)
            h = xt + embed(ids) if tied else xt
            loss = lm.cross_entropy(lm(h), target)
            loss.sum().backward()
            errs[f"{name} ce tied={tied} loss"] = _err(loss.detach(), ref.detach())
            errs[f"{name} ce tied={tied} dx"] = _err(xt.grad, x_leaf.grad)
            errs[f"{name} ce tied={tied} dW"] = _err(lm.weight.grad, _local_rows(w_leaf.grad, lm.partition, rank))
            free = tp.vocab_parallel_cross_entropy(lm(h).detach(), target, lm.partition, lm.communicator)
            errs[f"{name} ce function tied={tied}"] = _err(free, ref.detach())

    # An id outside the vocabulary: a ValueError on every rank, not zeros.
    embed = tp.VocabParallelEmbedding(10, 4, dtype=torch.float64)
    try:
        embed(torch.tensor([3, 10, 2]))
        messages["embed out of range"] = None
    except ValueError as e:
        messages["embed out of range"] = str(e)
    head = tp.ParallelLMHead(4, 10, dtype=torch.float64)
    try:
        head.cross_entropy(head(torch.randn(2, 4, dtype=torch.float64)), torch.tensor([1, 12]))
        messages["target out of range"] = None
    except ValueError as e:
        messages["target out of range"] = str(e)
    return errs, messages
