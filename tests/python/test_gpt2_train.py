"""GPT-2's training pass (mhsa.GPT2.loss_and_grad) against PyTorch autograd in float64 through
Hugging Face transformers' GPT2LMHeadModel on the same weights: the loss and every parameter's
gradient (embeddings, positions, LayerNorms, attention, MLP, the tied head) within 1e-5
relative L2."""

import numpy as np
import pytest
import torch

import mhsa

transformers = pytest.importorskip("transformers")


def model_pair(tmp_path, seed, **shape):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**shape)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorms, so that their gradients are tested too
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name or "ln_f" in name:
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    return hf.double(), mhsa.GPT2.load(tmp_path)


def torch_loss_and_grads(hf, ids, targets):
    hf.zero_grad()
    logits = hf(torch.as_tensor(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.as_tensor(targets).reshape(-1), ignore_index=-1)
    loss.backward()
    return loss.item(), {n.removeprefix("transformer."): p.grad.numpy() for n, p in hf.named_parameters()}


@pytest.mark.parametrize("shape", [dict(vocab_size=97, n_positions=32, n_embd=48, n_layer=2, n_head=4),
                                   dict(vocab_size=300, n_positions=64, n_embd=40, n_layer=3, n_head=1, n_inner=72)])
def test_gradients_match_torch_float64(rng, tmp_path, shape):
    hf, ours = model_pair(tmp_path, int(rng.integers(1 << 31)), **shape)
    V = shape["vocab_size"]
    ids = rng.integers(0, V, (3, 23))
    targets = rng.integers(0, V, (3, 23))
    targets[1, 4:9] = -1  # ignored positions (padding)
    loss, grads = ours.loss_and_grad(ids, targets)
    want_loss, want = torch_loss_and_grads(hf, ids, targets)
    assert abs(loss - want_loss) <= 1e-6 * abs(want_loss)
    assert set(grads) == set(want)
    for name, g in grads.items():
        err = np.linalg.norm(g - want[name]) / np.linalg.norm(want[name])
        assert err <= 1e-5, f"{name}: relative L2 {err:.2e}"


def test_loss_alone_equals_the_training_loss(rng, tmp_path):
    _, ours = model_pair(tmp_path, 3, vocab_size=97, n_positions=32, n_embd=48, n_layer=2, n_head=4)
    ids, targets = rng.integers(0, 97, (2, 31)), rng.integers(0, 97, (2, 31))
    assert ours.loss(ids, targets) == pytest.approx(ours.loss_and_grad(ids, targets)[0], rel=1e-12)
    # the loss of the logits forward() returns, computed in NumPy
    logits = ours.forward(ids).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ref = (lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]).mean()
    assert ours.loss(ids, targets) == pytest.approx(ref, rel=1e-5)


def test_training_errors_are_clear(tmp_path):
    m = mhsa.GPT2.random(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(mhsa.Error, match=r"targets\[0, 1\]: expected a token id in \[0, 50\) or -1 \(ignored\), got 50"):
        m.loss_and_grad([[1, 2]], [[1, 50]])
    with pytest.raises(mhsa.Error, match=r"targets: expected the shape of ids \[1, 2\], got \[1, 3\]"):
        m.loss_and_grad([[1, 2]], [[1, 2, 3]])
    with pytest.raises(mhsa.Error, match=r"expected a batch \[B, T\] with 1 <= T <= n_positions = 16"):
        m.loss(np.zeros((1, 17), np.int64), np.zeros((1, 17), np.int64))
