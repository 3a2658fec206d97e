"""Launchers: [B, H, L, D] views in (any strides with unit stride on D), kernels out.

:func:`relu_attention_fwd` and :func:`relu_attention_bwd` choose the kernels (pointer, descriptor or
float32 Gluon), their tiles (:mod:`.config`) and their launch order, and make the launches through
:func:`.plans._launch`; a later call with the same key replays them (:func:`.plans._planned`).
"""

from __future__ import annotations

import math

import torch
import triton

from ..._backend import is_interpreted, quiet_interpreter
from .._runtime import direct as _direct
from .._runtime import pdl as _gdc
from .._runtime.device import (
    bind_cuda_context,
    card_of,
    compute_capability_major,
    device_parallelism,
    on_input_device,
)
from . import gluon_launch
from .config import (
    DEFAULT,
    SHORT_L,
    AttnConfig,
    Choices,
    _causal_order,
    _fold,
    _peel,
    _relu_cvt,
    _tf32_copies,
    attention_config,
    few_programs,
    tf32_bwd_tiles,
)
from .copies import _l_contiguous
from .kernels_bwd import (
    _relu_attn_bwd_dkdv_kernel,
    _relu_attn_bwd_dkdv_tma_kernel,
    _relu_attn_bwd_dq_kernel,
    _relu_attn_bwd_dq_tma_kernel,
)
from .kernels_fwd import _relu_attn_fwd_kernel, _relu_attn_fwd_tma_kernel
from .plans import TensorDescriptor, _launch, _plan_key, _planned


def _batch_slices(B: int, H: int, max_pairs: int) -> list[slice]:
    """Slices of the batch whose (batch, head) pairs fit on a grid's second axis (H <= max_pairs)."""
    step = max(1, max_pairs // H)
    return [slice(b, min(b + step, B)) for b in range(0, B, step)]


def _bhld_strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _bh_d_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """Batch, head and D strides (of a copy with unit stride on L)."""
    return t.stride(0), t.stride(1), t.stride(3)


def _folded(grid: tuple[int, int], fold: bool) -> tuple[int, int]:
    """The (blocks, B*H) grid with two blocks per program along its first axis where ``fold``."""
    return (triton.cdiv(grid[0], 2), grid[1]) if fold else grid


def _gdc_usable(q: torch.Tensor, interp: bool, choices: Choices) -> bool:
    return _gdc.usable(q, interp) if choices.gdc is None else choices.gdc


@quiet_interpreter
@on_input_device
def relu_attention_fwd(q, k, v, causal: bool, squared: bool, scale: float, relu_scale: float, out=None,
                       config: AttnConfig | None = None, *, choices: Choices = DEFAULT):  # fmt: skip
    """Forward on [B, H, L, D] views (unit stride on D; ``v`` may have unit stride on L instead).
    ``out`` (same view convention) is allocated when not given; ``config`` overrides
    :func:`.config.attention_config` (for tuning); ``choices`` fixes what the launcher would otherwise
    decide by rule (:class:`.config.Choices`)."""
    return _forward(q, k, v, causal, squared, scale, relu_scale, out, config, choices)[0]


def _forward(q, k, v, causal, squared, scale, relu_scale, out, config, choices) -> tuple:
    """``(out, plan)``: the forward of :func:`relu_attention_fwd` and the launch plan that replays it on
    other tensors of the same key (``None`` where there is none)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    if out is None:
        out = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    if not out.numel():  # no query (Lq = 0) or no batch: nothing to compute, nothing launched
        return out, None
    if not Lk:  # no key: every output row is an empty sum, as in torch's attention
        return out.zero_(), None
    if B * H > choices.max_grid_1:  # more (batch, head) pairs than a grid's second axis holds: batch slices
        for b in _batch_slices(B, H, choices.max_grid_1):
            _forward(q[b], k[b], v[b], causal, squared, scale, relu_scale, out[b], config, choices)
        return out, None
    interp = is_interpreted(_relu_attn_fwd_kernel)
    card = card_of(q)
    cfg = config or attention_config("fwd", D, q.dtype, causal, interp, max(Lq, Lk), card)
    if config is None and not interp and q.element_size() == 2:
        cfg = few_programs(cfg, B * H * triton.cdiv(Lq, cfg.block_m), device_parallelism(q),
                           choices.few_programs_tile, D, 2, card)  # fmt: skip
    tensors = (q, k, v, out)
    key = None if interp or not choices.planning else _plan_key(
        "fwd", tensors, causal, squared, scale, relu_scale, cfg, choices)  # fmt: skip
    plan = _planned(key, tensors, _fwd_launches, causal, squared, scale, relu_scale, cfg, interp, choices)
    return out, plan


def _fwd_launches(q, k, v, out, causal, squared, scale, relu_scale, cfg, interp, choices) -> None:
    """The forward's launches (see :func:`relu_attention_fwd`) with tiles ``cfg``."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lq, cfg.block_m), B * H)
    key = (q.device, q.dtype, D, cfg)
    relu_cvt = _relu_cvt(interp, squared, q.dtype)
    if cfg.tma and _tma_usable(interp, q, k, v, out):
        order = _causal_order(k, causal) if choices.causal_order is None else choices.causal_order
        bind_cuda_context(q)
        _launch(
            _relu_attn_fwd_tma_kernel, grid, key,
            _desc(q, cfg.block_m), _desc(k, cfg.block_n), _desc(v, cfg.block_n), _desc(out, cfg.block_m),
            H, Lk, scale, relu_scale, *order, HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=causal, SQUARED=squared, RELU_CVT=relu_cvt, GROUPED=order[0] > 1, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )  # fmt: skip
        return
    chain = {}
    if _tf32_copies(q.dtype, interp):
        tiles = choices.tf32_fwd.get((causal, max(Lq, Lk) > SHORT_L))
        views = None
        if tiles is not None and tiles.trans:
            views = gluon_launch.usable(q, k, interp, tiles.block_m, tiles.block_n, v=v)
        if views:  # v's tiles transposed in the kernel, in sigma's order: no copy
            gluon_launch.launch(q, k, views, v, out, causal, squared, scale, relu_scale, tiles, True, False,
                                False, _tf32_group(B * H, causal, Lq // tiles.block_m, choices),
                                _launch)  # fmt: skip
            return
        # p @ v sums over keys (see _tf32_copies); where the GPU allows, the kernel is a dependent launch
        # whose programs take the SMs the copy's last programs leave and wait for the copy at their start.
        # The Gluon kernel takes the keys of v's copy in sigma's order; a v with unit stride on L already
        # is read as it is, the keys in their order
        gdc = _gdc_usable(q, interp, choices)
        views = gluon_launch.usable(q, k, interp, tiles.block_m, tiles.block_n) if tiles else None
        perm = views is not None and v.stride(2) != 1
        (v,) = _l_contiguous(v, signal=gdc, sigma=perm, tile=choices.copy_tile)
        chain = dict(WAIT=True, launch_pdl=True) if gdc else {}
        vt = v.transpose(2, 3)  # [B, H, D, L]
        if views and vt.is_contiguous():
            gluon_launch.launch(q, k, views, vt, out, causal, squared, scale, relu_scale, tiles, False, perm,
                                gdc, _tf32_group(B * H, causal, Lq // tiles.block_m, choices),
                                _launch)  # fmt: skip
            return
    fold = _fold(q.dtype, causal) if choices.fold is None else choices.fold
    peel = _peel(q.dtype, causal) if choices.peel is None else choices.peel
    _launch(
        _relu_attn_fwd_kernel, _folded(grid, fold), key,
        q, k, v, out, *_bhld_strides(q), *_bhld_strides(k), *_bhld_strides(v), v.stride(3),
        *_bhld_strides(out), H, Lq, Lk, scale, relu_scale,
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
        EVEN_M=Lq % cfg.block_m == 0, EVEN_N=Lk % cfg.block_n == 0, IS_FP64=q.dtype == torch.float64,
        UPCAST=interp and q.dtype == torch.bfloat16, RELU_CVT=relu_cvt, PEEL=peel,
        FOLD=fold, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **chain,
    )  # fmt: skip


def _tf32_group(heads: int, causal: bool, blocks: int, choices: Choices) -> int:
    """The Gluon kernels' heads per group of the launch order (:func:`.gluon_launch.head_group`)."""
    return gluon_launch.head_group(heads, causal, blocks, choices.group_programs, choices.head_group)


@quiet_interpreter
@on_input_device
def relu_attention_bwd(q, k, v, do, causal: bool, squared: bool, scale: float, relu_scale: float,
                       dq=None, dk=None, dv=None, configs: tuple | None = None,
                       trans_copies: bool | None = None, *, choices: Choices = DEFAULT):  # fmt: skip
    """Backward on [B, H, L, D] views: returns ``(dq, dk, dv)`` (allocated when not given);
    ``configs = (dkdv_config, dq_config)`` overrides :func:`.config.attention_config` (for tuning);
    ``trans_copies`` (default: float32 on GPUs) reads q, dout and k for the products summed over L from
    copies with unit stride on L (see :func:`.config._tf32_copies`); ``choices`` as in
    :func:`relu_attention_fwd`. ``scale`` must be positive (as the public API checks): the kernels take
    relu's derivative from the sign of the unscaled scores."""
    if not 0 < scale < math.inf:  # NaN too
        raise ValueError(f"scale must be a finite number > 0 for the backward, got {scale}: its kernels take "
                         "relu's derivative from the sign of the unscaled scores")  # fmt: skip
    return _backward(q, k, v, do, causal, squared, scale, relu_scale, dq, dk, dv, configs, trans_copies,
                     choices)[:3]  # fmt: skip


def _backward(q, k, v, do, causal, squared, scale, relu_scale, dq, dk, dv, configs, trans_copies,
              choices) -> tuple:  # fmt: skip
    """``(dq, dk, dv, plan)``: the backward of :func:`relu_attention_bwd` and its launch plan (see
    :func:`_forward`)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    dq = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty((B, H, Lk, D), dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty((B, H, Lk, D), dtype=v.dtype, device=v.device) if dv is None else dv
    if not (dq.numel() and dk.numel()):  # no query or no key (or no batch): every gradient is zero
        return dq.zero_(), dk.zero_(), dv.zero_(), None
    if B * H > choices.max_grid_1:  # as in _forward
        for b in _batch_slices(B, H, choices.max_grid_1):
            _backward(q[b], k[b], v[b], do[b], causal, squared, scale, relu_scale, dq[b], dk[b], dv[b],
                      configs, trans_copies, choices)  # fmt: skip
        return dq, dk, dv, None
    interp = is_interpreted(_relu_attn_bwd_dkdv_kernel)
    copies = _tf32_copies(q.dtype, interp) if trans_copies is None else trans_copies
    card, length = card_of(q), max(Lq, Lk)
    cfg_dkdv = configs[0] if configs else attention_config("dkdv", D, q.dtype, causal, interp, length, card)
    cfg_dq = configs[1] if configs else attention_config("dq", D, q.dtype, causal, interp, length, card)
    tensors = (q, k, v, do, dq, dk, dv)
    decided = (causal, squared, scale, relu_scale, cfg_dkdv, cfg_dq, copies)
    key = None if interp or not choices.planning else _plan_key("bwd", tensors, *decided, choices)
    plan = _planned(key, tensors, _bwd_launches, *decided, interp, choices)
    return dq, dk, dv, plan


def _bwd_launches(q, k, v, do, dq, dk, dv, causal, squared, scale, relu_scale, cfg_dkdv, cfg_dq, copies,
                  interp, choices) -> None:  # fmt: skip
    """The backward's launches (see :func:`relu_attention_bwd`) with tiles ``cfg_dkdv`` and ``cfg_dq``."""
    tma = (cfg_dkdv.tma or cfg_dq.tma) and not copies and _tma_usable(interp, q, k, v, do, dq, dk, dv)
    common = (causal, squared, scale, relu_scale, interp, copies)
    # float32's copies (q and dout for the dK/dV kernel, k for the dQ kernel) in one launch up front, so
    # that nothing runs between the two kernels (the three copies live together: one more than if k's
    # came after the dK/dV kernel)
    gdc = _gdc_usable(q, interp, choices)
    tried = tf32_bwd_tiles(choices, causal, max(q.shape[2], k.shape[2]), card_of(q)) if copies else []
    # the Gluon kernels, on the first tiles that fit
    outs = (dq, dk, dv)
    tiles = next((t for t in tried if gluon_launch.usable_bwd(q, k, v, do, None, outs, interp, t)), None)
    if tiles is not None:
        # a kernel whose tiles say trans transposes its tiles itself; the others' copies are made, in
        # one launch, in sigma's order (every kernel relabels its left operands)
        trans = (tiles.dkdv.trans, tiles.dkdv.trans, tiles.dq.trans)
        wanted = [t for t, own in zip((q, do, k), trans, strict=True) if not own]
        made = iter(_l_contiguous(*wanted, signal=gdc, sigma=True, tile=choices.copy_tile))
        cs = tuple(None if own else next(made) for own in trans)
        found = gluon_launch.usable_bwd(q, k, v, do, cs, (dq, dk, dv), interp, tiles)
        if found:
            B, H, Lq, _ = q.shape
            blocks = max(k.shape[2] // tiles.dkdv.block_n, Lq // tiles.dq.block_m)
            group = _tf32_group(B * H, causal, blocks, choices)
            gluon_launch.launch_bwd(q, k, v, do, dq, dk, dv, found, causal, squared, scale, relu_scale,
                                    tiles, gdc and bool(wanted), gdc, group, _launch)  # fmt: skip
            return
    qc, doc, kc = _l_contiguous(q, do, k, signal=gdc, tile=choices.copy_tile) if copies else (q, do, k)
    # the two kernels are independent (each reads q, k, v and dout only): where the GPU allows, the dQ
    # kernel is a programmatic dependent launch that starts on the SMs the dK/dV kernel's last programs
    # leave, and waits for that kernel only at its end (_gdc); after float32's copies, the dK/dV kernel
    # is one too, waiting for the copies at its start
    order = dict(GDC=gdc, WAIT=True, launch_pdl=True) if copies and gdc else dict(GDC=gdc)
    fold = _fold(q.dtype, causal) if choices.fold is None else choices.fold
    peel = _peel(q.dtype, causal) if choices.peel is None else choices.peel
    _bwd_dkdv(q, k, v, do, dk, dv, qc, doc, cfg_dkdv, tma and cfg_dkdv.tma, *common, order=order, peel=peel,
              fold=fold)  # fmt: skip
    _bwd_dq(q, k, v, do, dq, kc, cfg_dq, tma and cfg_dq.tma, *common,
            order=dict(GDC=True, launch_pdl=True) if gdc else {}, peel=peel, fold=fold)  # fmt: skip


def _qkvdo_strides(q, k, v, do) -> tuple[int, ...]:
    return (*_bhld_strides(q), *_bhld_strides(k), *_bhld_strides(v), *_bhld_strides(do))


def _bwd_dkdv(q, k, v, do, dk, dv, qc, doc, cfg, tma, causal, squared, scale, relu_scale, interp, copies, *,
              order, peel, fold):  # fmt: skip
    """The dK/dV kernel, through tensor descriptors with ``tma`` (see :func:`relu_attention_bwd`); with
    ``copies``, ``qc`` and ``doc`` are q and dout with unit stride on L; ``order``: its grid dependency
    control (``GDC``); ``peel``, ``fold``: see :func:`.config._peel`, :func:`.config._fold`."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lk, cfg.block_n), B * H)
    key = (q.device, q.dtype, D, cfg)
    relu_cvt = _relu_cvt(interp, squared, q.dtype)
    if tma:
        bind_cuda_context(q)
        _launch(
            _relu_attn_bwd_dkdv_tma_kernel, grid, key,
            _desc(q, cfg.block_m), _desc(k, cfg.block_n), _desc(v, cfg.block_n), _desc(do, cfg.block_m),
            _desc(dk, cfg.block_n), _desc(dv, cfg.block_n), H, Lq, scale, relu_scale,
            HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
            RELU_CVT=relu_cvt, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
        )  # fmt: skip
        return
    _launch(
        _relu_attn_bwd_dkdv_kernel, _folded(grid, fold), key,
        q, k, v, do, dk, dv, qc, doc, *_qkvdo_strides(q, k, v, do), *_bhld_strides(dk), *_bhld_strides(dv),
        *_bh_d_strides(qc), *_bh_d_strides(doc), H, Lq, Lk, scale, relu_scale,
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
        EVEN_M=Lq % cfg.block_m == 0, EVEN_N=Lk % cfg.block_n == 0, IS_FP64=q.dtype == torch.float64,
        UPCAST=interp and q.dtype == torch.bfloat16, TRANS_COPIES=copies, RELU_CVT=relu_cvt,
        PEEL=peel, FOLD=fold, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
    )  # fmt: skip


def _bwd_dq(q, k, v, do, dq, kc, cfg, tma, causal, squared, scale, relu_scale, interp, copies, *, order, peel,
            fold):  # fmt: skip
    """The dQ kernel, through tensor descriptors with ``tma`` (see :func:`relu_attention_bwd`); with
    ``copies``, ``kc`` is k with unit stride on L; ``order``: its grid dependency control (``GDC``,
    ``launch_pdl``)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lq, cfg.block_m), B * H)
    key = (q.device, q.dtype, D, cfg)
    relu_cvt = _relu_cvt(interp, squared, q.dtype)
    if tma:
        bind_cuda_context(q)
        _launch(
            _relu_attn_bwd_dq_tma_kernel, grid, key,
            _desc(q, cfg.block_m), _desc(k, cfg.block_n), _desc(v, cfg.block_n), _desc(do, cfg.block_m),
            _desc(dq, cfg.block_m), H, Lk, scale, relu_scale,
            HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
            RELU_CVT=relu_cvt, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
        )  # fmt: skip
        return
    _launch(
        _relu_attn_bwd_dq_kernel, _folded(grid, fold), key,
        q, k, v, do, dq, kc, *_qkvdo_strides(q, k, v, do), *_bhld_strides(dq), *_bh_d_strides(kc), H, Lq, Lk,
        scale, relu_scale,
        HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, SQUARED=squared,
        EVEN_M=Lq % cfg.block_m == 0, EVEN_N=Lk % cfg.block_n == 0, IS_FP64=q.dtype == torch.float64,
        UPCAST=interp and q.dtype == torch.bfloat16, TRANS_COPIES=copies, RELU_CVT=relu_cvt,
        PEEL=peel, FOLD=fold, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **order,
    )  # fmt: skip



def _tma_usable(interp: bool, *tensors: torch.Tensor) -> bool:
    """Whether the descriptor kernels can read and write ``tensors`` ([B, H, L, D] views): 16-bit types
    on a GPU with a copy engine for tensors (compute capability 9+; any dtype under the interpreter),
    D <= 128 (a box row of at most 256 bytes), 16-byte aligned base and strides, unit stride on D, no
    empty dimension. These are the checks of Triton's ``TensorDescriptor``, which :func:`_desc` skips."""
    if TensorDescriptor is None:
        return False
    t0 = tensors[0]
    if not interp:
        if t0.device.type != "cuda" or t0.dtype not in (torch.bfloat16, torch.float16):
            return False
        if compute_capability_major(t0) < 9:
            return False
    if t0.shape[3] > 128:
        return False
    esize = t0.element_size()
    for t in tensors:
        s0, s1, s2, s3 = t.stride()
        if s3 != 1 or t.data_ptr() % 16 or min(s0, s1, s2) <= 0 or (s0 | s1 | s2) * esize % 16:
            return False
        if not t.numel():  # a descriptor's dims must be positive; the pointer kernels take empty tensors
            return False
    return True


def _desc(t: torch.Tensor, rows: int):
    """A rank-4 tensor descriptor over the [B, H, L, D] view ``t``, boxes of ``rows`` x D. The launcher
    calls ``bind_cuda_context`` first: Triton fills the descriptor before it makes a context current."""
    return _direct.descriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])


