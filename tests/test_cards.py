"""Launch tables per GPU model: a card reads its own model's table, then the other models' of the same
architecture; a card the tables do not serve gets the rule, fitted to its shared memory, and correct
results (the cards here are pretended: no test needs the GPU it names)."""

from __future__ import annotations

import pytest
import torch
from _attention import kink_slack, qkv, randn
from _layer_norm_checks import ln_tol
from crossfuse.ops import layer_norm as ln
from crossfuse.ops import relu_attention as ra
from crossfuse.ops._runtime.device import Card, card_of, tables_label
from crossfuse.reference import relu_attention_ref
from crossfuse.tolerances import relerr, relerr_with_slack, tolerance

H100 = Card("NVIDIA H100 80GB HBM3", (9, 0), 232448)
H200 = Card("NVIDIA H200", (9, 0), 232448)
# a card of the tables' architecture that no table is named after
OTHER_HOPPER = Card("NVIDIA H800", (9, 0), 232448)
# cards of other architectures: an A100's shared memory, and a smaller one (sm_86, 99 KB)
A100 = Card("NVIDIA A100-SXM4-80GB", (8, 0), 166912)
SMALL = Card("NVIDIA RTX A6000", (8, 6), 101376)
UNTABLED = [A100, SMALL]


@pytest.mark.parametrize(
    "name, model",
    [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H200", "H200"),
     ("NVIDIA H200 NVL", "H200"), ("NVIDIA GH200 480GB", None), ("NVIDIA A100-SXM4-80GB", None)],
)  # fmt: skip
def test_a_card_is_known_by_the_model_in_its_name(name, model):
    assert Card(name, (9, 0), 0).model == model


@pytest.mark.parametrize("op", [ln, ra], ids=["layer_norm", "relu_attention"])
def test_a_card_reads_its_own_table_first_then_the_others(op):
    assert op.tables_for(H100)[:2] == (op.OVERRIDES, op.TUNED_H100)
    assert op.tables_for(H200)[:2] == (op.OVERRIDES, op.TUNED_H200)
    for card in (H100, H200, OTHER_HOPPER, None):  # every table of the architecture, each once
        tables = op.tables_for(card)
        assert len(tables) == 1 + len(op.TABLES)
        assert {id(t) for t in tables[1:]} == {id(t) for t in op.TABLES.values()}
    for card in UNTABLED:
        assert op.tables_for(card) == (op.OVERRIDES,)


def test_the_h100_layer_norm_table_serves_narrow_rows_on_every_hopper_card():
    # measured on the H100: the rule it replaced ran the bf16 backward of 262144 x 512 at 342 GB/s
    narrow, wide = ln.TUNED_H100[("bwd", 2, 512, True)], ln.TUNED_H200[("fwd", 2, 1024, True)]
    for card in (H100, H200, OTHER_HOPPER):
        assert ln.launch_config(512, torch.bfloat16, "bwd", 131072, card) == narrow
    # and the H200's entries the wider rows, on the H100 too
    assert ln.launch_config(1024, torch.bfloat16, "fwd", 65536, H100) == wide


def test_rows_past_the_fused_length_take_the_h100_entries_on_every_hopper_card():
    # measured on the H100 (bench/tune.py --only ln-long): the grouped Gluon backward and long chunks, in
    # place of the rule's chunks of 4096; a length between two powers of 2 takes the next one's entry
    for card in (H100, H200, OTHER_HOPPER):
        for n, key_n in ((20000, 32768), (32768, 32768), (40000, 65536), (65536, 65536)):
            for kind in ("fwd", "bwd"):
                for dtype, esize in ((torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 4)):
                    cfg = ln.launch_config(n, dtype, kind, 1000, card)
                    assert cfg == ln.TUNED_H100[(kind, esize, key_n, False)] != ln.rule_config(n, kind)
        # many rows of 65536 (not measured) take the few rows' entry, not the rule
        many = {n: ln.launch_config(n, torch.float32, "bwd", 16384, card) for n in (32768, 65536)}
        t = ln.TUNED_H100
        assert many == {32768: t[("bwd", 4, 32768, True)], 65536: t[("bwd", 4, 65536, False)]}
    # past MAX_N's power of 2 nothing is tabled
    assert ln.launch_config(ln.MAX_N, torch.float32, "fwd", 1000, H100) == ln.rule_config(ln.MAX_N, "fwd")


def test_16bit_rows_of_no_multiple_of_16_take_the_padded_configuration():
    # measured on the H100 (the tables' entries 1.03-1.36x slower at 4500, 5000, 9000, 11000 columns; as fast
    # or faster at multiples of 16): on every card the tables serve, lengths of 4 or 8 modulo 16, the forward
    # up to FUSED_MAX_N, the backward up to 8192
    padded = ln.PADDED_ROWS
    for card in (H100, H200, OTHER_HOPPER, None):
        for n, kinds in ((4100, "fwd bwd"), (4500, "fwd bwd"), (5000, "fwd bwd"), (8188, "fwd bwd"),
                         (8196, "fwd"), (16380, "fwd")):  # fmt: skip
            for dtype in (torch.bfloat16, torch.float16):
                for kind, m in (("fwd", 1000), ("bwd", 16384)):
                    got = ln.launch_config(n, dtype, kind, m, card)
                    assert (got == padded.config(n, kind)) == (kind in kinds.split()), (n, kind)
                    assert padded.takes(n, 2, kind) == (kind in kinds.split())
    # multiples of 16, lengths not measured (odd, 2 modulo 4), rows up to 4096 or past the whole-row kernels,
    # and float32 rows keep the tables' entries
    for n, esize in ((4608, 2), (5008, 2), (5600, 2), (8192, 2), (12288, 2), (4097, 2), (5002, 2), (4092, 2),
                     (1000, 2), (16388, 2), (5000, 4)):  # fmt: skip
        assert not any(padded.takes(n, esize, kind) for kind in ("fwd", "bwd")), n
    assert padded.config(5000, "bwd").block_n == 8192 and padded.config(5000, "fwd").block_n < 5000


def test_a_padded_rule_that_takes_nothing_leaves_the_tables():
    off = ln.PaddedRows(min_n=ln.FUSED_MAX_N + 1)
    for kind in ("fwd", "bwd"):
        got = ln.launch_config(5000, torch.bfloat16, kind, 4096, H100, padded=off)
        table = ln.launch_config(8192, torch.bfloat16, kind, 4096, H100)
        assert got == table != ln.PADDED_ROWS.config(5000, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [4500, 5000, 7000])
def test_layer_norm_with_the_padded_configuration_against_float64(n, dtype, device, gen):
    # the chunked forward read twice, and the whole-row backward of 32 warps (through tensor descriptors
    # on a Hopper GPU where the rows allow: not at 4500), at widths no tile divides
    m = 5
    x = randn((m, n), dtype, device, gen)
    w, b = randn((n,), dtype, device, gen), randn((n,), dtype, device, gen)
    y, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5, config=ln.PADDED_ROWS.config(n, "fwd"))
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    assert relerr(y, ref) <= ln_tol(dtype, "fwd", m)
    dy = randn((m, n), dtype, device, gen)
    dx, dw, db = ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=ln.PADDED_ROWS.config(n, "bwd"))
    leaves = [t.double().requires_grad_(True) for t in (x, w, b)]
    torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5).backward(dy.double())
    assert relerr(dx, leaves[0].grad) <= ln_tol(dtype, "bwd", m)
    for got, leaf in zip((dw, db), leaves[1:], strict=True):
        assert relerr(got, leaf.grad) <= ln_tol(dtype, "reduced", m)


@pytest.mark.parametrize("card", UNTABLED, ids=lambda c: c.name)
def test_a_card_the_tables_do_not_serve_gets_the_rule(card):
    for n in (64, 100, 512, 768, 1024, 5000, 16384, 65536):
        for kind in ("fwd", "bwd"):
            for dtype in (torch.bfloat16, torch.float32):
                cfg = ln.launch_config(n, dtype, kind, 131072, card)
                assert cfg == ln.rule_config(n, kind)
                assert not (cfg.tma_stages or cfg.smem_rows or cfg.coop), cfg  # nothing Hopper's alone


@pytest.mark.parametrize("card", UNTABLED, ids=lambda c: c.name)
def test_attention_tiles_of_an_untabled_card_fit_its_shared_memory(card):
    for d in ra.HEAD_DIMS:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for causal in (False, True):
                for kind in ("fwd", "dkdv", "dq"):
                    cfg = ra.attention_config(kind, d, dtype, causal, length=4096, card=card)
                    assert not cfg.tma, cfg
                    shared = ra.shared_bytes(kind, d, dtype.itemsize, cfg)
                    assert shared <= card.max_shared_mem, (kind, d, cfg)
                    if kind == "dkdv":  # the causal loops' tiles divide each other
                        assert cfg.block_n % cfg.block_m == 0, cfg
                    else:
                        assert cfg.block_m % cfg.block_n == 0, cfg


def test_fitting_takes_stages_first_then_streamed_tiles():
    cfg = ra.AttnConfig(128, 64, 8, 3)
    assert ra.fit_shared("fwd", 64, 2, cfg, 1 << 20) == cfg
    two = ra.fit_shared("fwd", 128, 2, cfg, ra.shared_bytes("fwd", 128, 2, ra.AttnConfig(128, 64, 8, 2)))
    assert two == ra.AttnConfig(128, 64, 8, 2)
    assert ra.fit_shared("fwd", 256, 4, cfg, 0) == ra.AttnConfig(128, 16, 8, 1)  # as small as it goes
    assert ra.fit_shared("dkdv", 256, 4, ra.AttnConfig(64, 128, 8, 3), 0) == ra.AttnConfig(16, 128, 8, 1)


@pytest.mark.parametrize("card", UNTABLED, ids=lambda c: c.name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [16, 64, 256])
def test_attention_with_an_untabled_cards_tiles_against_float64(card, causal, d, device, gen):
    # the tiles chosen for the pretended card, launched here (compiled for this GPU, or interpreted):
    # lengths that are no multiple of a tile, and gradients too
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # float32 on a GPU would be tf32
    lq = lk = 80
    q, k, v = qkv(1, 2, lq, lk, d, dtype, device, gen)
    do = randn(q.shape, dtype, device, gen)
    scale, relu_scale = d**-0.5, 1 / lk
    kinds = ("fwd", "dkdv", "dq")
    cfgs = [ra.attention_config(kind, d, dtype, causal, length=lk, card=card) for kind in kinds]
    out = ra.relu_attention_fwd(q, k, v, causal, False, scale, relu_scale, config=cfgs[0])
    grads = ra.relu_attention_bwd(q, k, v, do, causal, False, scale, relu_scale, configs=tuple(cfgs[1:]))
    refs = [t.double().requires_grad_(True) for t in (q, k, v)]
    out_ref = relu_attention_ref(*refs, causal=causal, scale=scale, relu_scale=relu_scale)
    out_ref.backward(do.double())
    assert relerr(out, out_ref) <= tolerance("relu_attention", dtype, "fwd")
    slack = kink_slack(*refs, do.double(), causal, False, scale=scale, relu_scale=relu_scale)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        err = relerr_with_slack(got, ref.grad, slack[name])
        assert err <= tolerance("relu_attention", dtype, "bwd"), (name, err)


@pytest.mark.parametrize("card", UNTABLED, ids=lambda c: c.name)
@pytest.mark.parametrize("m, n", [(7, 100), (300, 512), (33, 1000)], ids=str)
def test_layer_norm_with_an_untabled_cards_configs_against_float64(card, m, n, device, gen):
    x = randn((m, n), torch.float32, device, gen)
    w, b = randn((n,), torch.float32, device, gen), randn((n,), torch.float32, device, gen)
    fwd = ln.launch_config(n, x.dtype, "fwd", m, card)
    y, mean, rstd = ln.layer_norm_fwd(x, w, b, 1e-5, config=fwd)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    assert relerr(y, ref) <= ln_tol(x.dtype, "fwd", m)
    dy = randn((m, n), torch.float32, device, gen)
    bwd = ln.launch_config(n, x.dtype, "bwd", m, card)
    dx, dw, db = ln.layer_norm_bwd(dy, x, w, mean, rstd, True, True, config=bwd)
    leaves = [t.double().requires_grad_(True) for t in (x, w, b)]
    torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5).backward(dy.double())
    assert relerr(dx, leaves[0].grad) <= ln_tol(x.dtype, "bwd", m)
    for got, leaf in zip((dw, db), leaves[1:], strict=True):
        assert relerr(got, leaf.grad) <= ln_tol(x.dtype, "reduced", m)


def test_a_run_names_the_tables_its_card_reads():
    # schema.versions records this for the current GPU (tables=...), so that a result says what launched
    label = lambda card, overrides=ln.OVERRIDES: tables_label(card, overrides, ln.TABLES)  # noqa: E731
    assert label(H100).split(",")[0] == "H100" and label(H200).split(",")[0] == "H200"
    assert sorted(label(OTHER_HOPPER).split(",")) == sorted(ln.TABLES)
    assert label(A100) == label(SMALL) == "rule"
    assert label(H100, {("fwd", 2, 1024, True): None}).split(",")[:2] == ["tuned.json", "H100"]
    assert label(A100, {("fwd", 2, 1024, True): None}) == "tuned.json,rule"


def test_card_of_a_cpu_tensor_is_none():
    assert card_of(torch.zeros(1)) is None
