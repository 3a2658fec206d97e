"""``cnn.swap_layer_norms``: what it swaps, what it keeps, what it refuses, and the swapped model's
numbers against the unswapped one (a plain torch model here; tiny transformers and timm models where those
libraries are installed)."""

from __future__ import annotations

import copy
import warnings

import crossfuse.nn as cnn
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from crossfuse.nn import swap_layer_norms


class SameForward(torch.nn.LayerNorm):
    """A subclass that changes the constructor only: its forward is torch's."""

    def __init__(self, n, **kw):
        super().__init__(n, eps=1e-6, **kw)


class Upcast(torch.nn.LayerNorm):
    """A subclass that computes in float32 and casts back: layer norm, but its forward is its own."""

    def forward(self, x):
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class Channels(torch.nn.LayerNorm):
    """Normalises the channels of NCHW tensors: not the function crossfuse computes on its input."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(torch.nn.Module):
    def __init__(self, d, device=None, dtype=None):
        super().__init__()
        f = dict(device=device, dtype=dtype)
        self.ln1 = torch.nn.LayerNorm(d, **f)
        self.fc = torch.nn.Linear(d, d, **f)
        self.ln2 = SameForward(d, **f)
        self.ln3 = torch.nn.LayerNorm(d, elementwise_affine=False, **f)
        self.ln4 = torch.nn.LayerNorm(d, bias=False, **f)

    def forward(self, x):
        x = x + self.fc(self.ln1(x))
        return self.ln4(self.ln3(self.ln2(x)))


class Model(torch.nn.Module):
    def __init__(self, d=32, device=None, dtype=None):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(d, device, dtype), Block(d, device, dtype))
        self.norm = torch.nn.LayerNorm(d, eps=1e-3, device=device, dtype=dtype)

    def forward(self, x):
        return self.norm(self.blocks(x))


ALL = ["blocks.0.ln1", "blocks.0.ln2", "blocks.0.ln3", "blocks.0.ln4",
       "blocks.1.ln1", "blocks.1.ln2", "blocks.1.ln3", "blocks.1.ln4", "norm"]  # fmt: skip


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))


def test_swaps_every_layer_norm_in_place_keeping_parameters_and_settings(device):
    model = Model(device=device)
    _randomise(model)
    ref = copy.deepcopy(model)
    params = {n: p for n, p in model.named_parameters()}
    settings = {n: (m.normalized_shape, m.eps, m.elementwise_affine, m.weight is None, m.bias is None)
                for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the parameters before the swap
    swapped = swap_layer_norms(model)
    assert swapped == ALL
    for name in ALL:
        m = model.get_submodule(name)
        assert type(m) is cnn.LayerNorm
        assert (m.normalized_shape, m.eps, m.elementwise_affine, m.weight is None, m.bias is None) == (
            settings[name]
        )
    assert model.get_submodule("norm").eps == 1e-3 and model.get_submodule("blocks.0.ln2").eps == 1e-6
    assert dict(model.named_parameters()) == params  # the very same Parameter objects
    assert all(a is b for a, b in zip(model.parameters(), params.values(), strict=True))
    assert model.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 5, 32, device=device)
    y, y_ref = model(x), ref(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    y.square().mean().backward()
    y_ref.square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=n)
    before = model.norm.weight.detach().clone()
    opt.step()  # the optimizer built before the swap still updates the swapped modules' weights
    assert not torch.equal(model.norm.weight, before)
    assert swap_layer_norms(model) == []  # idempotent


def test_keeps_dtype_device_training_flag_and_hooks(device):
    model = Model(d=16, device=device, dtype=torch.bfloat16).eval()
    seen = []
    model.norm.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    swap_layer_norms(model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {torch.device(device).type}
    assert not any(m.training for m in model.modules())
    model(torch.randn(2, 16, device=device, dtype=torch.bfloat16))
    assert seen == [torch.bfloat16]


def test_a_layer_norm_as_the_root_and_shared_modules():
    ln = torch.nn.LayerNorm(8)
    assert swap_layer_norms(ln) == [""] and type(ln) is cnn.LayerNorm
    shared = torch.nn.LayerNorm(8)
    tree = torch.nn.ModuleDict({"a": shared, "b": torch.nn.Sequential(shared)})
    assert swap_layer_norms(tree) == ["a"]  # one object, swapped once, under its first name
    assert type(tree["b"][0]) is cnn.LayerNorm


def test_subclasses_with_their_own_forward_are_left_alone_unless_accepted(device):
    tree = torch.nn.ModuleDict({"up": Upcast(16, device=device), "ch": Channels(4),
                                "ln": torch.nn.LayerNorm(16)})  # fmt: skip
    with pytest.warns(UserWarning, match=r"left 2 LayerNorm subclass modules alone.*up .*Upcast.*ch "):
        assert swap_layer_norms(tree) == ["ln"]
    assert type(tree["up"]) is Upcast and type(tree["ch"]) is Channels
    _randomise(tree)
    ref = copy.deepcopy(tree["up"])
    with pytest.warns(UserWarning, match="Channels"):
        assert swap_layer_norms(tree, accept=[Upcast]) == ["up"]
    assert type(tree["up"]) is cnn.LayerNorm
    x = torch.randn(4, 16, device=device, dtype=torch.bfloat16)
    tree["up"].to(torch.bfloat16)
    ref.to(torch.bfloat16)
    y = tree["up"](x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref(x), rtol=1.6e-2, atol=1e-2)


def test_known_subclass_by_name_is_swapped_without_accept():
    # a class named as timm's LayerNorm (cnn.swap.KNOWN_LAYER_NORMS), whose forward is F.layer_norm
    known = type("LayerNorm", (Upcast,), {"__module__": "timm.layers.norm", "forward": Upcast.forward})
    tree = torch.nn.Sequential(known(8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert swap_layer_norms(tree) == ["0"]


def test_include_selects_by_name_or_predicate():
    assert swap_layer_norms(Model(), include="blocks.1.*") == [n for n in ALL if n.startswith("blocks.1.")]
    assert swap_layer_norms(Model(), include=["norm", "*.ln3"]) == ["blocks.0.ln3", "blocks.1.ln3", "norm"]
    picked = swap_layer_norms(Model(), include=lambda name, m: not m.elementwise_affine)
    assert picked == ["blocks.0.ln3", "blocks.1.ln3"]
    assert swap_layer_norms(torch.nn.Linear(2, 2)) == []


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: swap_layer_norms("model"), TypeError, "model must be a torch.nn.Module, got str"),
        (lambda: swap_layer_norms(Model(), include=3), TypeError, "include must be None"),
        (lambda: swap_layer_norms(Model(), include=["norm", 3]), TypeError, "include's patterns must be str"),
        (lambda: swap_layer_norms(Model(), accept=Upcast), TypeError, "accept must be an iterable"),
        (lambda: swap_layer_norms(Model(), accept=[torch.nn.Linear]), TypeError, "LayerNorm subclasses"),
    ],
)  # fmt: skip
def test_bad_input_names_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_rows_larger_than_the_kernels_take_are_left_alone():
    from crossfuse.ops.layer_norm import MAX_N

    big = torch.nn.LayerNorm(MAX_N + 1, device="meta")
    tree = torch.nn.ModuleDict({"big": big, "ok": torch.nn.LayerNorm(4)})
    with pytest.warns(UserWarning, match="big"):
        assert swap_layer_norms(tree) == ["ok"]


class _Slotted(torch.nn.LayerNorm):
    __slots__ = ("extra",)


def test_a_class_of_another_layout_is_left_alone_and_the_others_swapped():
    tree = torch.nn.ModuleDict({"slotted": _Slotted(4), "ok": torch.nn.LayerNorm(4)})
    with pytest.warns(UserWarning, match=r"slotted \(.*_Slotted: its instances' memory layout"):
        assert swap_layer_norms(tree) == ["ok"]
    assert type(tree["slotted"]) is _Slotted and type(tree["ok"]) is cnn.LayerNorm


class _Twice(torch.nn.Module):
    def forward(self, w):
        return 2 * w


def test_a_parametrized_layer_norm_keeps_its_parametrization(device):
    from torch.nn.utils import parametrize

    m = torch.nn.Sequential(torch.nn.LayerNorm(8, device=device), torch.nn.LayerNorm(8, device=device))
    parametrize.register_parametrization(m[0], "weight", _Twice())
    x = torch.randn(3, 8, device=device)
    want = m(x)
    assert swap_layer_norms(m, native_below=0) == ["0", "1"]
    assert isinstance(m[0], cnn.LayerNorm) and parametrize.is_parametrized(m[0], "weight")
    got = m(x)  # the fused kernels, reading the weight through the parametrization
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    assert m[0].parametrizations.weight.original.grad is not None
    parametrize.remove_parametrizations(m[0], "weight")
    assert type(m[0]) is cnn.LayerNorm  # what the parametrization leaves: a crossfuse LayerNorm


def _loss_and_grads(model, inputs):
    out = model(**inputs)
    loss = out.last_hidden_state.float().square().mean() if hasattr(out, "last_hidden_state") else out
    loss = loss if loss.dim() == 0 else loss.float().square().mean()
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return loss.detach(), grads


def _check_model(model, inputs, expected_swaps):
    model.eval()
    ref = copy.deepcopy(model)
    swapped = swap_layer_norms(model)
    assert len(swapped) == expected_swaps
    assert not any(type(m) is torch.nn.LayerNorm for m in model.modules())
    loss, grads = _loss_and_grads(model, inputs)
    ref_loss, ref_grads = _loss_and_grads(ref, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)


def test_tiny_transformers_models(device):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install crossfuse[models])"
    )
    torch.manual_seed(0)
    small = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
                 eos_token_id=0)  # fmt: skip
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(**small)).to(device)
    ids = torch.randint(0, 64, (2, 8), device=device)
    _check_model(gpt2, {"input_ids": ids}, 3)  # ln_1, ln_2 of the block, ln_f
    bert = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64,
        max_position_embeddings=16, pad_token_id=0)).to(device)  # fmt: skip
    _check_model(bert, {"input_ids": ids}, 3)  # embeddings, attention output, output


def test_tiny_timm_vision_transformer(device):
    try:
        import timm
    except Exception as exc:  # not installed, or a torchvision that does not load with this torch
        why = f"{type(exc).__name__}: {exc}"
        pytest.skip(f"timm cannot be imported here ({why}); pip install crossfuse[models]")
    torch.manual_seed(0)
    vit = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=16, patch_size=8, embed_dim=32,
                            depth=1, num_heads=2, num_classes=4).to(device)  # fmt: skip
    lns = sum(isinstance(m, torch.nn.LayerNorm) for m in vit.modules())
    _check_model(vit, {"x": torch.randn(2, 3, 16, 16, device=device)}, lns)


def test_native_below_is_a_checked_module_setting_that_swap_passes_on():
    # the size under which a CUDA input runs torch's own layer norm: a constructor argument (the class
    # default otherwise), refused when not an int >= 0, shown in repr, not part of the state_dict
    ln = cnn.LayerNorm(8)
    assert ln.native_below == cnn.layer_norm.NATIVE_BELOW > 0
    assert cnn.LayerNorm(8, native_below=0).native_below == 0
    assert "native_below=0" in repr(cnn.LayerNorm(8, native_below=0))
    assert list(cnn.LayerNorm(8, native_below=0).state_dict()) == ["weight", "bias"]
    with pytest.raises(ValueError, match="native_below must be an int >= 0"):
        cnn.LayerNorm(8, native_below=-1)
    for bad in (1.5, True, "10"):  # of the wrong type: a TypeError, as every argument's
        with pytest.raises(TypeError, match="native_below must be an integer"):
            cnn.LayerNorm(8, native_below=bad)
    assert cnn.LayerNorm(8, native_below=np.int64(5)).native_below == 5
    model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    assert cnn.swap_layer_norms(model, native_below=123) == ["0", "2"]
    assert model[0].native_below == model[2].native_below == 123
    plain = torch.nn.Sequential(torch.nn.LayerNorm(8))
    cnn.swap_layer_norms(plain)
    assert plain[0].native_below == cnn.layer_norm.NATIVE_BELOW
    with pytest.raises(ValueError, match="native_below"):
        cnn.swap_layer_norms(torch.nn.Sequential(torch.nn.LayerNorm(8)), native_below=-5)


def test_native_below_runs_the_fused_kernels_on_the_cpu_at_every_size(monkeypatch, device):
    # torch's own layer norm is chosen for small CUDA inputs only: on the CPU (the interpreter) every
    # input goes to crossfuse.layer_norm
    from crossfuse.nn import layer_norm as module

    if device != "cpu":
        pytest.skip("CPU tensors run the kernels under Triton's interpreter, which a GPU's run leaves off")

    calls = []
    real = module.layer_norm
    monkeypatch.setattr(module, "layer_norm", lambda *a: calls.append(1) or real(*a))
    ln = cnn.LayerNorm(8, native_below=1 << 30)
    x = torch.randn(4, 8)
    torch.testing.assert_close(ln(x), torch.nn.functional.layer_norm(x, (8,), ln.weight, ln.bias))
    assert calls == [1]


@pytest.mark.gpu
def test_small_cuda_inputs_run_torchs_layer_norm_and_large_ones_the_fused_kernels(monkeypatch):
    from crossfuse.nn import layer_norm as module

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    calls = []
    real = module.layer_norm
    monkeypatch.setattr(module, "layer_norm", lambda *a: calls.append(a[0].numel()) or real(*a))
    ln = cnn.LayerNorm(256, device="cuda", dtype=torch.bfloat16, native_below=4096)
    small, large = (torch.randn(m, 256, device="cuda", dtype=torch.bfloat16) for m in (8, 64))
    want = F.layer_norm(small, (256,), ln.weight, ln.bias)
    assert torch.equal(ln(small), want) and calls == []  # torch's own, bit for bit
    ln(large)
    assert calls == [64 * 256]
    # another dtype than the weights', or autocast: the fused kernels (the output dtype never depends on
    # the size)
    ln(small.float())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ln(small)
    assert calls == [64 * 256, 8 * 256, 8 * 256]
    ln.native_below = 0
    ln(small)
    assert calls[-1] == 8 * 256
    # the size test and autocast check trace into one graph, torch's op in it
    ln.native_below = 4096
    compiled = torch.compile(ln, fullgraph=True)
    assert torch.equal(compiled(small), want)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert compiled(small).dtype == torch.bfloat16
