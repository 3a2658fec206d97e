"""The float32 attention forward in Gluon, with both products' left operands in registers (attention v26).

Compiled for sm_90 (Triton 3.6), Triton's float32 forward (``_relu_attn_fwd_kernel``) multiplies with
both operands of both products in shared memory: Triton keeps a product's left operand in registers for
16-bit types only, so ``p`` is stored to shared memory every step and read back, and ``q`` is read again
by every ``q @ k^T``. Per step of 64 x 64 x 64 that is 64 KB read and 16 KB written besides the 32 KB the
copies of k and v write: 9.4 FLOP per byte of shared memory, 59% of tf32's rate at 128 bytes a clock, and
the kernel runs at 58% of it (bench/results/h200/NOTES.md, attention v26). Here ``q`` is loaded into
registers once, in the layout of a product's left operand, and ``p`` is moved there from the scores'
layout by shuffles; both products read only their right operand (k, then v's copy with unit stride on L)
from shared memory: 32 KB read a step.

One warp group per 64 query rows (``num_warps`` 4 or 8); k and v's copy stream through ``STAGES``
shared-memory buffers filled by the copy engine (an mbarrier each); each step's products are synchronous
(the warp groups of other programs on the SM fill the tensor cores meanwhile). Rows of q and k, and of
the output, are addressed through 2-D views: ``(rb, rh, ch)`` place row l of head (b, h) at row
``b*rb + h*rh + l``, column ``h*ch`` of the view (heads in rows for [B, H, L, D] layouts, in columns for
[B, L, H, D]); v's copy is [B, H, D, L]. Sequence lengths must be multiples of both tiles (see
:func:`usable`): there are no masks for tails.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .._backend import bind_cuda_context, compute_capability_major
from ._ln_bwd_rows import GLUON_TRITON, triton_version

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # Triton without Gluon's Hopper modules
    gluon = None

if gluon is not None:

    @gluon.jit
    def _step(acc, q, zero, j, ring, offs_m, scale, s_layout: gl.constexpr, p_layout: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SQUARED: gl.constexpr,
              MASKED: gl.constexpr):  # fmt: skip
        """Key block j: its scores, p (keys after the query masked where MASKED), ``acc += p @ v``; then its
        buffers take key block j + STAGES. (A mask chosen per block by a run-time ``if`` came out wrong
        from Triton 3.6 on the GPU, run 287: the diagonal blocks have a loop of their own instead.)"""
        k_s, vt_s, bars, Kd, VTd, k_row, k_col, vt_row, steps = ring
        slot = j % STAGES
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
        sc = warpgroup_mma(q, k_s.index(slot).permute((1, 0)), zero, use_acc=False)
        a = gl.maximum(sc * scale, 0.0, propagate_nan=tl.PropagateNan.ALL)
        if SQUARED:
            p = a * a
        else:
            p = a
        if MASKED:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            p = gl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        acc = warpgroup_mma(gl.convert_layout(p, p_layout), vt_s.index(slot).permute((1, 0)), acc)
        # every warp's products have read buffer slot: it takes key block j + STAGES
        gl.thread_barrier()
        nxt = j + STAGES
        ok = nxt < steps
        mbarrier.expect(bars.index(slot), Kd.block_type.nbytes + VTd.block_type.nbytes, pred=ok)
        tma.async_copy_global_to_shared(Kd, [k_row + nxt * BLOCK_N, k_col], bars.index(slot),
                                        k_s.index(slot), pred=ok)  # fmt: skip
        tma.async_copy_global_to_shared(VTd, [vt_row, nxt * BLOCK_N], bars.index(slot), vt_s.index(slot),
                                        pred=ok)  # fmt: skip
        return acc

    @gluon.jit
    def _attn_fwd_tf32_kernel(
        Qd, Kd, VTd,  # 2-D descriptors: q and k (boxes [BLOCK, HEAD_D]), v's copy (boxes [HEAD_D, BLOCK_N])
        O,  # out, (B, H, L, HEAD_D) through strides
        stride_ob, stride_oh, stride_ol,
        H, Lk,
        q_rb, q_rh, q_ch, k_rb, k_rh, k_ch,  # where head (b, h) sits in the 2-D views of q and k
        scale, relu_scale,
        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, SQUARED: gl.constexpr,
        WAIT: gl.constexpr,  # a dependent launch after v's copy: wait for it first (crossfuse.ops._gdc)
    ):  # fmt: skip
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 8])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, HEAD_D, 8])  # fmt: skip
        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=1)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=1)

        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # causal: the heaviest query blocks first
        pid_bh = gl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        start_m = pid_m * BLOCK_M
        if CAUSAL:
            steps = gl.minimum(start_m + BLOCK_M, Lk) // BLOCK_N
        else:
            steps = Lk // BLOCK_N
        k_row = b * k_rb + h * k_rh
        k_col = h * k_ch
        vt_row = pid_bh * HEAD_D

        if WAIT:
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip
        q_s = gl.allocate_shared_memory(Qd.dtype, [BLOCK_M, HEAD_D], Qd.layout)
        k_s = gl.allocate_shared_memory(Kd.dtype, [STAGES, BLOCK_N, HEAD_D], Kd.layout)
        vt_s = gl.allocate_shared_memory(VTd.dtype, [STAGES, HEAD_D, BLOCK_N], VTd.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        step_bytes: gl.constexpr = Kd.block_type.nbytes + VTd.block_type.nbytes
        mbarrier.expect(q_bar, Qd.block_type.nbytes)
        tma.async_copy_global_to_shared(Qd, [b * q_rb + h * q_rh + start_m, h * q_ch], q_bar, q_s)
        for s in gl.static_range(STAGES):  # the first key blocks' copies
            ok = s < steps
            mbarrier.expect(bars.index(s), step_bytes, pred=ok)
            tma.async_copy_global_to_shared(Kd, [k_row + s * BLOCK_N, k_col], bars.index(s), k_s.index(s),
                                            pred=ok)  # fmt: skip
            tma.async_copy_global_to_shared(VTd, [vt_row, s * BLOCK_N], bars.index(s), vt_s.index(s), pred=ok)

        mbarrier.wait(q_bar, 0)
        q = q_s.load(q_layout)
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        ring = (k_s, vt_s, bars, Kd, VTd, k_row, k_col, vt_row, steps)
        if CAUSAL:  # the key blocks before the diagonal, then the diagonal's, masked (two loops, one ring)
            n_full = start_m // BLOCK_N
            for j in range(n_full):
                acc = _step(acc, q, zero, j, ring, offs_m, scale, s_layout, p_layout, BLOCK_N, STAGES,
                            SQUARED, False)  # fmt: skip
            for j in range(n_full, steps):
                acc = _step(acc, q, zero, j, ring, offs_m, scale, s_layout, p_layout, BLOCK_N, STAGES,
                            SQUARED, True)  # fmt: skip
        else:
            for j in range(steps):
                acc = _step(acc, q, zero, j, ring, offs_m, scale, s_layout, p_layout, BLOCK_N, STAGES,
                            SQUARED, False)  # fmt: skip

        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        mbarrier.invalidate(q_bar)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_ptrs = O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + rows[:, None] * stride_ol
        gl.store(o_ptrs + offs_d[None, :], acc * relu_scale)


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


def usable(q: torch.Tensor, k: torch.Tensor, interpreted: bool, block_m: int, block_n: int):
    """The row views (:func:`rows_view`) of q and k where the Gluon forward can take them, else ``None``:
    float32 on compute capability 9+ with the Triton of ``GLUON_TRITON``, not under the interpreter;
    ``block_n`` divides ``block_m`` (the causal loops' diagonal blocks), the lengths are multiples of
    ``block_m``, the views' bases and rows 16-byte aligned."""
    if gluon is None or interpreted or q.device.type != "cuda" or q.dtype != torch.float32:
        return None
    if triton_version() != GLUON_TRITON:
        return None
    if compute_capability_major(q) < 9 or q.shape[3] not in (32, 64, 128):
        return None
    if block_m % block_n or q.shape[2] % block_m or k.shape[2] % block_m:  # (then block_n divides them too)
        return None
    views = (rows_view(q), rows_view(k))
    for view in views:
        if view is None or view[0].data_ptr() % 16 or view[0].stride(0) * view[0].element_size() % 16:
            return None
    return views


def _desc(view: torch.Tensor, block: list[int]):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float32)
    return TensorDescriptor(view, list(view.shape), list(view.stride()), block, layout)


def launch(q, k, views, vt, out, causal: bool, squared: bool, scale: float, relu_scale: float, block_m: int,
           block_n: int, stages: int, wait: bool, run) -> None:  # fmt: skip
    """The forward on [B, H, L, D] views q, k (``views``: their row views, what :func:`usable` returned), out
    and v's copy ``vt`` ([B, H, D, L] contiguous), through ``run(kernel, grid, key, *args, **options)`` (the
    launcher's ``_launch``)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    (qv, q_rb, q_rh, q_ch), (kv, k_rb, k_rh, k_ch) = views
    bind_cuda_context(q)
    args = (
        _desc(qv, [block_m, D]), _desc(kv, [block_n, D]), _desc(vt.reshape(B * H * D, Lk), [D, block_n]),
        out, out.stride(0), out.stride(1), out.stride(2), H, Lk, q_rb, q_rh, q_ch, k_rb, k_rh, k_ch,
        scale, relu_scale,
    )  # fmt: skip
    options = dict(HEAD_D=D, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, SQUARED=squared,
                   WAIT=wait, num_warps=block_m // 16)  # fmt: skip
    if wait:
        options["launch_pdl"] = True
    run(_attn_fwd_tf32_kernel, (Lq // block_m, B * H), (q.device, q.dtype, D, "tf32", block_m, block_n),
        *args, num_stages=1, **options)  # fmt: skip
