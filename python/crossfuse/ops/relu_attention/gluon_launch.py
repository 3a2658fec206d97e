"""The float32 attention in Gluon: the products' left operands in registers; tiles, checks and launches.

Compiled for sm_90 (Triton 3.6), Triton's float32 forward (``_relu_attn_fwd_kernel``) multiplies with
both operands of both products in shared memory: Triton keeps a product's left operand in registers for
16-bit types only, so ``p`` is stored to shared memory every step and read back, and ``q`` is read again
by every ``q @ k^T``. Per step of 64 x 64 x 64 that is 64 KB read and 16 KB written besides the 32 KB the
copies of k and v write: 9.4 FLOP per byte of shared memory, 59% of tf32's rate at 128 bytes a clock, and
the kernel ran at 58% of it on the H200. Here (:mod:`.gluon_fwd`) ``q`` is loaded into registers once, in
the layout of a product's left operand, and ``p`` stays in registers; both products read only their right
operand (k, then v) from shared memory: 32 KB read a step.

One warp group per 64 query rows (``num_warps`` 4 or 8); k and v stream through ``STAGES`` shared-memory
buffers filled by the copy engine (an mbarrier each); each step's products are synchronous (the warp
groups of other programs on the SM fill the tensor cores meanwhile), or with ASYNC in flight: block
j+1's scores are issued before block j's relu and ``p @ v``, which runs on while block j+1's relu is
taken (k and v then have rings of their own). With TRANS the kernel reads v itself, not a copy with unit
stride on L: each step's v tile is read from shared memory into registers, 4 keys of one column a
thread, and stored transposed (16-byte vectors along the keys) into one of two buffers that the ``p @
v`` product reads, while the step's scores run; the 128-row tiles' two buffers are q's, which is in
registers by then. That costs a step 32 KB of shared-memory traffic besides the products' 96 and saves
the launch of v's copy, a pass over v: faster but at long non-causal sequences. Rows of q, k (and v),
and of the output, are addressed through 2-D views: ``(rb, rh, ch)`` place row l of head (b, h) at row
``b*rb + h*rh + l``, column ``h*ch`` of the view (heads in rows for [B, H, L, D] layouts, in columns for
[B, L, H, D]); v's copy is [B, H, D, L]. Sequence lengths must be multiples of both tiles (see
:func:`usable`): there are no masks for tails.

The backward (:mod:`.gluon_bwd`) is two kernels of the same kind. The dK/dV kernel holds a block of k
and v in registers and streams q, dout and their copies with unit stride on L: ``s^T = k q^T`` and
``dp^T = v dout^T``, then ``dv += p^T dout`` and ``dk += ds^T q``; the dQ kernel holds q and dout and
streams k, v and k's copy: ``s = q k^T``, ``dp = dout v^T``, ``dq += ds k``. With TRANS a kernel reads
no copy: it transposes its tiles of q and dout (dK/dV) or of k (dQ) into buffers of its own as the
forward does v's, while the scores run; the dK/dV kernel then has two tiles to transpose a step on 4
warps, which only the causal rows up to L=2048 repay. With ASYNC each product is issued asynchronously
and the elementwise work before the next one runs while it does (``warpgroup_mma_wait``): 1.02-1.06x
the synchronous form. Triton's float32 backward kernels, which keep every tf32 product's left operand in
shared memory, write p^T, ds^T and ds there each step and read them back.

A product's accumulator becomes the next product's left operand without moving: a thread holds columns
2t, 2t + 1 of each 8 of an accumulator and columns t, t + 4 of a tf32 left operand, so the columns are
relabelled by a fixed permutation sigma of each 8 (:func:`gluon_common._left`) instead of exchanged
between the lanes of a quad (32 shuffles and 64 selects a thread a step at 128 x 64: a third of the
forward loop's instructions), and the right operand takes its rows in sigma's order: the copies are made
so (``_l_contiguous`` with ``sigma``) and :func:`gluon_common._transpose` stores so: 1.10-1.19x the
forward and 1.04-1.18x the backward without it. The forward applies a positive ``scale`` with
``relu_scale``, to the output (relu(s * scale) = scale * relu(s); squared, scale^2: :func:`fold_scale`),
which takes the multiply off each score: 1.015-1.025x.

Every kernel's blocks start in the order of :func:`head_group`: where causal, the heaviest blocks of a
group of heads first, not of one head after another's. A kernel launched after a copy (the forward
after v's, where not TRANS; the dK/dV kernel after those of q, dout and k) issues its loads of the
tensors the copy does not write before it waits for the copy.
"""

from __future__ import annotations

import functools
import math

import torch

from .._runtime.device import bind_cuda_context, compute_capability_major
from .._runtime.versions import GLUON_TRITON, triton_version
from .config import GROUP_PROGRAMS, Tf32BwdTiles, Tf32Tiles
from .gluon_common import gluon

if gluon is not None:
    from .gluon_bwd import _attn_bwd_dkdv_tf32_kernel, _attn_bwd_dq_tf32_kernel
    from .gluon_common import TensorDescriptor, gl
    from .gluon_fwd import _attn_fwd_tf32_kernel


def rows_view(t: torch.Tensor):
    """``(view, rb, rh, ch)``: a 2-D view of the [B, H, L, D] view ``t`` (unit stride on D) in which row l of
    head (b, h) is row ``b*rb + h*rh + l`` and starts at column ``h*ch``; ``None`` where no such view
    exists (the L stride must divide the batch stride and either divide the head stride or exceed the heads'
    columns)."""
    B, H, L, D = t.shape
    s0, s1, s2, s3 = t.stride()
    if s3 != 1 or s2 <= 0 or s0 <= 0 or s1 <= 0 or s0 % s2:
        return None
    if s1 % s2 == 0:  # heads in rows ([B, H, L, D]-like)
        rb, rh, ch = s0 // s2, s1 // s2, 0
        cols = D
    elif (H - 1) * s1 + D <= s2:  # heads in columns ([B, L, H, D]-like)
        rb, rh, ch = s0 // s2, 0, s1
        cols = (H - 1) * s1 + D
    else:
        return None
    rows = (B - 1) * rb + (H - 1) * rh + L
    return torch.as_strided(t, (rows, cols), (s2, 1)), rb, rh, ch


def _row_views(tensors, interpreted: bool, multiple: int):
    """The row views (:func:`rows_view`) of ``tensors`` ([B, H, L, D] views) where the Gluon kernels can
    take them, else ``None``: float32 on compute capability 9+ with the Triton of ``GLUON_TRITON``, not
    under the interpreter; lengths multiples of ``multiple``; the views' bases and rows 16-byte aligned."""
    q = tensors[0]
    if gluon is None or interpreted or q.device.type != "cuda" or q.dtype != torch.float32:
        return None
    if triton_version() != GLUON_TRITON:
        return None
    if compute_capability_major(q) < 9 or q.shape[3] not in (32, 64, 128):
        return None
    if any(t.shape[2] % multiple for t in tensors):
        return None
    views = tuple(rows_view(t) for t in tensors)
    for view in views:
        if view is None or view[0].data_ptr() % 16 or view[0].stride(0) * view[0].element_size() % 16:
            return None
    return views


def usable(q: torch.Tensor, k: torch.Tensor, interpreted: bool, block_m: int, block_n: int,
           v: torch.Tensor | None = None):  # fmt: skip
    """The row views of q and k (and of v where given: the kernel then transposes v's tiles itself) where
    the Gluon forward can take them, else ``None`` (see :func:`_row_views`); ``block_n`` must divide
    ``block_m`` (the causal loops' diagonal blocks), the lengths be multiples of ``block_m``."""
    if block_m % block_n:
        return None
    return _row_views((q, k) if v is None else (q, k, v), interpreted, block_m)


def l_major_2d(copy: torch.Tensor):
    """The [B*H*D, L] matrix of a [B, H, L, D] view with unit stride on L whose [B, H, D, L] transpose is
    contiguous (the launcher's copies), else ``None``."""
    t = copy.transpose(2, 3)
    if not t.is_contiguous() or t.data_ptr() % 16 or t.shape[3] * t.element_size() % 16:
        return None
    return t.reshape(-1, t.shape[3])


def usable_bwd(q, k, v, do, copies, outs, interpreted: bool, tiles: Tf32BwdTiles):
    """``(row views of q, k, v, dout; [B*H*D, L] matrices of the copies of q, dout, k)`` where the Gluon
    backward can take them, else ``None``: as :func:`_row_views`, D <= 64, each kernel's query tile
    dividing its key tile (dK/dV) or the reverse (dQ), the larger tile at least 64 rows (4 warps), lengths
    multiples of every tile, ``copies`` (q, dout and k with unit stride on L; ``None`` for those a kernel
    transposes itself, ``trans``, and for all of them to check the views only) whose transposes are
    contiguous; ``outs`` (dq, dk, dv) with unit stride on D."""
    if any(t.stride(3) != 1 for t in outs):
        return None
    bm1, bn1, bm2, bn2 = tiles.dkdv.block_m, tiles.dkdv.block_n, tiles.dq.block_m, tiles.dq.block_n
    if bn1 % bm1 or bm2 % bn2 or min(bn1, bm2) < 64:  # a warp per 16 rows; wgmma needs 4
        return None
    if q.shape[3] > 64:  # D=128: compiled for D <= 64 only (the dK/dV kernel keeps k, v, dk, dv in registers)
        return None
    views = _row_views((q, k, v, do), interpreted, math.lcm(bn1, bm2))
    if views is None:
        return None
    copies = copies or (None, None, None)
    mats = tuple(None if c is None else l_major_2d(c) for c in copies)
    if any(m is None and c is not None for m, c in zip(mats, copies, strict=True)):
        return None
    return views, mats


def head_group(heads: int, causal: bool, blocks: int, programs: int = GROUP_PROGRAMS,
               force: int | None = None) -> int:  # fmt: skip
    """The heads per group of the launch order (``_block_order``) of a kernel with ``blocks`` programs per
    head: 1 where not causal (one head's blocks after another's, which read its k and v from L2 while
    they are there). A causal block's work grows with its distance from the first one, and the blocks of a
    group start heaviest first: with one head at a time the last head's heaviest block starts among the
    last programs and runs on alone (at L=1024 the forward's 64 x 64 tiles took 1.06x as long as with
    groups of 16 heads on the H200). There the group is the smallest divisor of ``heads`` with at least
    ``programs`` programs (all heads where fewer). ``force`` (a probe's choice) gives its largest common
    divisor with ``heads`` instead."""
    if force is not None:
        return math.gcd(force, heads)
    return _causal_group(heads, blocks, programs) if causal else 1


@functools.lru_cache(maxsize=256)
def _causal_group(heads: int, blocks: int, programs: int) -> int:
    return next((g for g in range(1, heads + 1) if heads % g == 0 and g * blocks >= programs), heads)


def _desc(view: torch.Tensor, block: list[int]):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float32)
    return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)


def fold_scale(scale: float, relu_scale: float, squared: bool) -> tuple[bool, float]:
    """``(fold, relu_scale)``: whether the forward takes ``scale`` with ``relu_scale`` instead of applying
    it to each score: for a positive, finite scale relu(s * scale) = scale * relu(s), so the output takes
    scale (squared: scale^2) with relu_scale; a scale that is not positive stays with the scores."""
    if 0 < scale < math.inf:
        return True, relu_scale * (scale * scale if squared else scale)
    return False, relu_scale


def launch(q, k, views, v, out, causal: bool, squared: bool, scale: float, relu_scale: float,
           tiles: Tf32Tiles, trans: bool, perm: bool, wait: bool, group: int, run) -> None:  # fmt: skip
    """The forward on [B, H, L, D] views q, k (``views``: their row views, what :func:`usable` returned),
    out and v: where ``trans``, v itself (``views`` then holds its row view too: :func:`usable` with v),
    transposed in the kernel; else v's copy ([B, H, D, L] contiguous). The keys of ``p @ v`` are taken in
    sigma's order (:func:`gluon_common._left`) where ``trans`` (the kernel transposes v's tiles so) and
    with ``perm``, which says that v's copy is in that order (``_l_contiguous`` with ``sigma``). ``group``:
    the heads per group of the launch order (:func:`head_group`). Launched through ``run(kernel, grid,
    key, *args, **options)`` (the launcher's ``_launch``)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    block_m, block_n = tiles.block_m, tiles.block_n
    (qv, q_rb, q_rh, q_ch), (kv, k_rb, k_rh, k_ch), *rest = views
    if trans:
        ((vv, *vh),) = rest
        v_desc = _desc(vv, [block_n, D])
    else:
        vh = (0, 0, 0)
        v_desc = _desc(v.reshape(B * H * D, Lk), [D, block_n])
    bind_cuda_context(q)
    fold, relu_scale = fold_scale(scale, relu_scale, squared)
    args = (
        _desc(qv, [block_m, D]), _desc(kv, [block_n, D]), v_desc, out, out.stride(0), out.stride(1),
        out.stride(2), H, Lk, group, q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, *vh, scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=tiles.stages, CAUSAL=causal,
                   SQUARED=squared, WAIT=wait, ASYNC=bool(tiles.is_async), TRANS=bool(trans), PERM=bool(perm),
                   FOLD=fold, num_warps=block_m // 16)  # fmt: skip
    if trans and block_m == 128 and D <= 64:
        # two programs an SM (96 KB of shared memory each): at most 128 registers a thread (the causal
        # kernel takes 157 without the cap, and spills 76 bytes in its diagonal loop with it)
        options["maxnreg"] = 128
    if wait:
        options["launch_pdl"] = True
    grid = (Lq // block_m * group, B * H // group)
    run(_attn_fwd_tf32_kernel, grid, (q.device, q.dtype, D, "tf32", block_m, block_n), *args, num_stages=1,
        **options)  # fmt: skip


def launch_bwd(q, k, v, do, dq, dk, dv, usable_views, causal: bool, squared: bool, scale: float,
               relu_scale: float, tiles: Tf32BwdTiles, chain: bool, signal: bool, group: int,
               run) -> None:  # fmt: skip
    """The backward's two kernels on [B, H, L, D] views (``usable_views``: what :func:`usable_bwd`
    returned), through ``run`` (the launcher's ``_launch``). A kernel whose tiles say ``trans``
    transposes its tiles of q and dout (dK/dV) or k (dQ) itself, and its copies are not given. Both
    kernels take the left operands of their last products relabelled in sigma's order
    (:func:`gluon_common._left`): the copies must be in that order too (``_l_contiguous`` with ``sigma``).
    With ``chain``, the dK/dV kernel is a dependent launch after the copies; with ``signal``, the dQ
    kernel is one after the dK/dV kernel (ops._runtime.pdl). ``group``: as in :func:`launch`."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    ((qv, *qh), (kv, *kh), (vv, *vh), (dov, *doh)), (qt, dot, kt) = usable_views
    bind_cuda_context(q)
    t = tiles.dkdv
    bm, bn = t.block_m, t.block_n
    q_desc, do_desc = _desc(qv, [bm, D]), _desc(dov, [bm, D])
    qt_desc, dot_desc = (q_desc, do_desc) if t.trans else (_desc(qt, [D, bm]), _desc(dot, [D, bm]))
    args = (
        _desc(kv, [bn, D]), _desc(vv, [bn, D]), q_desc, do_desc, qt_desc, dot_desc, dk, dv, *dk.stride()[:3],
        *dv.stride()[:3], H, Lq, group, *kh, *vh, *qh, *doh, scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=t.stages, CAUSAL=causal, SQUARED=squared,
                   CHAIN=chain, ASYNC=bool(t.is_async), TRANS=bool(t.trans), SIGNAL=signal and not chain,
                   num_warps=bn // 16)  # fmt: skip
    if chain:
        options["launch_pdl"] = True
    grid = (Lk // bn * group, B * H // group)
    run(_attn_bwd_dkdv_tf32_kernel, grid, (q.device, q.dtype, D, "tf32-dkdv", bm, bn), *args, num_stages=1,
        **options)  # fmt: skip
    t = tiles.dq
    bm, bn = t.block_m, t.block_n
    k_desc = _desc(kv, [bn, D])
    args = (
        _desc(qv, [bm, D]), _desc(dov, [bm, D]), k_desc, _desc(vv, [bn, D]),
        k_desc if t.trans else _desc(kt, [D, bn]), dq, *dq.stride()[:3], H, Lk, group, *qh, *doh, *kh, *vh,
        scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=t.stages, CAUSAL=causal, SQUARED=squared,
                   WAIT_END=signal, ASYNC=bool(t.is_async), TRANS=bool(t.trans),
                   num_warps=bm // 16)  # fmt: skip
    if signal:
        options["launch_pdl"] = True
    grid = (Lq // bm * group, B * H // group)
    run(_attn_bwd_dq_tf32_kernel, grid, (q.device, q.dtype, D, "tf32-dq", bm, bn), *args, num_stages=1,
        **options)  # fmt: skip
