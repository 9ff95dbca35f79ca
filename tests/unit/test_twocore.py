"""Two-core backward (cprobe.models.twocore): the same gradients and the same trained weights, bit for bit, as the
plain one-thread backward — the tiny models' documented numbers depend on it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cprobe.models.twocore import _Addmm, two_core_backward
from tests.conftest import make_random_model

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)


def _grads(model: nn.Module, batch: dict, two_cores: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks
    with two_core_backward(model, enabled=two_cores):
        out = model(**batch)
        out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])
def test_gradients_are_bitwise_those_of_the_plain_backward(arch):
    model, tok = make_random_model(arch)
    model.train()
    enc = tok(["the author near the guards is here", "the authors that w1 likes are here ."], padding=True,
              return_tensors="pt")
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "labels": enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)}
    logits, plain = _grads(model, batch, two_cores=False)
    logits2, two = _grads(model, batch, two_cores=True)
    assert torch.equal(logits, logits2)
    assert plain.keys() == two.keys() and len(plain) > 10
    for name in plain:
        assert torch.equal(plain[name], two[name]), name  # exactly, not approximately


def test_the_patch_is_used_in_the_block_and_gone_after_it():
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 5, 4, requires_grad=True)
    with two_core_backward(lin):
        y = lin(x)
        assert "forward" in vars(lin)
    assert "forward" not in vars(lin)
    nodes, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None:
            nodes.add(type(node).__name__)
            todo += [n for n, _ in node.next_functions]
    assert _Addmm.__name__ + "Backward" in nodes
    y.sum().backward()
    ref = x.detach().clone().requires_grad_()
    nn.functional.linear(ref, lin.weight, lin.bias).sum().backward()
    assert torch.equal(x.grad, ref.grad)
    with two_core_backward(lin, enabled=False):
        assert "forward" not in vars(lin)


def test_tiny_training_gives_the_same_weights_on_one_core_and_two():
    """A few steps of the tiny-model trainer (BERT with its agreement loss, and GPT-NeoX): identical state dicts."""
    from cprobe.data.grammar import GrammarConfig, generate, vocabulary
    from cprobe.models import tiny

    grammar = GrammarConfig(n_sentences=80, seed=3)
    data = generate(grammar)
    train = tiny.TinyTrainConfig(layers=1, hidden=16, heads=2, intermediate=32, steps=4, batch_size=8)
    weights = {}
    for kind in ("bert", "neox"):
        tok = tiny.build_tokenizer(kind, sorted(set(vocabulary(grammar))), 64)
        ids = tok([" ".join(e.words) for e in data.examples])["input_ids"]
        pos = [e.target + 1 for e in data.examples]
        forms = (tok.convert_tokens_to_ids([e.correct for e in data.examples]),
                 tok.convert_tokens_to_ids([e.wrong for e in data.examples]))
        for cpus in (1, 2):  # the job's thread budget (compute.thread_budget): one core, or a second for the backward
            torch.manual_seed(0)
            model = tiny._init_model(kind, tok, train)
            tiny._train(model, tok, kind, ids, pos, forms, train, progress=False, cores=cpus)
            weights[kind, cpus] = model.state_dict()
        for name, w in weights[kind, 1].items():
            assert torch.equal(w, weights[kind, 2][name]), (kind, name)
