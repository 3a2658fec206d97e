"""ReLU attention in Triton, flash-style: forward and backward with no L x L tensor.

Formula (per batch and head; ``q`` is Lq x D, ``k`` and ``v`` are Lk x D)::

    s   = q @ k^T                                  (float32 accumulation)
    a   = relu(s * scale)                          scale = 1/sqrt(D) by default, must be > 0
    p   = a            or   a^2  (squared=True)
    p   = 0 where causal and key j > query i       (causal needs Lq == Lk)
    out = relu_scale * p @ v                       relu_scale = 1/Lk by default

Gradient (with ``dp = relu_scale * dout @ v^T``)::

    dv = relu_scale * p^T @ dout
    ds = dp * scale * [s > 0]         or   dp * 2 * a * scale   (squared)
    dq = ds @ k,   dk = ds^T @ q

relu's derivative at a score of exactly 0 is taken as 0 (torch's ``relu`` convention; masked and
padded scores are 0 and get no gradient). With ``squared`` the derivative at 0 is 0 either way.

Design: unlike softmax attention there is no running max and no normaliser, so a query block simply
accumulates ``p @ v`` over key blocks in float32 and scales once at the end. Grid = (query blocks,
batch*heads), heaviest causal blocks first; key/value blocks are streamed; causal blocks above the
diagonal are never visited (the loop bounds skip them), and only the diagonal blocks pay for the mask.
So that causal kernels do not end on heavy blocks started last, float32's give each program a heavy
block and its light mirror (``config._fold``), and the 16-bit D=64 forward of long sequences takes its
last (batch, head) pairs as one group, heaviest blocks first (``config._causal_order``).
The backward runs two kernels: dK/dV (a program owns a key block and streams query blocks) and dQ (a
program owns a query block and streams key blocks), recomputing the scores: no atomics, deterministic.
On compute capability 9+ the dQ kernel is a programmatic dependent launch: it starts on the SMs the
dK/dV kernel's last programs leave and waits for that kernel only at its end (``_runtime.pdl``).
On Hopper and later, where the tuned table says ``tma``, 16-bit tensors with 16-byte-aligned strides go
through copies of the three kernels that load and store through tensor descriptors (the copy engine, TMA;
see ``launch._tma_usable``): same math, tails zero-filled by the hardware instead of masked.
Compiled bfloat16 relu (not squared) rounds relu(s) to bf16 in one instruction per pair of scores
(``kernels_common._relu_to_bf16``) and applies ``scale`` to the float32 accumulators instead (relu(s *
scale) = scale * relu(s) for scale > 0; ds likewise), 1.02-1.23x faster on the H200 than a multiply, a
max and a convert per score.
The float32 path uses tf32 tensor cores on GPUs (Triton's default for float32 dots); the products summed
over the sequence read copies of their operands with unit stride on L (v in the forward; q, dout, k in the
backward, made before both kernels, in one launch where Lq == Lk; see ``config._tf32_copies``), one pass
over each, so float32 needs up to three extra input-sized buffers while the backward runs. On compute
capability 9+ the kernel after a copy is a dependent launch that waits for the copy at its start. There,
with Triton 3.6, the float32 kernels are Gluon kernels (:mod:`.gluon_launch`) that keep the left operands
of their products in registers, which Triton keeps in shared memory for 32-bit types, where lengths are
multiples of their tiles (``config.TF32_FWD``, ``config.TF32_BWD``, and past ``LONGEST_L`` on a card of
``config.TF32_BWD_LONGEST`` its backward's tiles first); where their tiles say ``trans`` they
transpose their tiles in shared memory instead of reading copies.
A call whose shapes, strides, dtypes, alignment, flags and tiles match an earlier call's replays that
call's launches (:mod:`.plans`); an eager call of :func:`relu_attention` whose arguments' key was seen
skips its checks and decisions too (:mod:`.api`).
Under torch.compile the autograd function calls the launchers through custom operators
(``torch.ops.crossfuse.relu_attention_fwd``/``_bwd``, see ``_library``), which the tracer does not enter.

Limits: D in {16, 32, 64, 128, 256}; any Lq, Lk >= 0 (tails masked; no key gives zeros, no query an
empty output, as torch's attention); Lq != Lk only when not causal; float32, float16, bfloat16 (float64
only under the interpreter, for gradcheck); layouts ``"bhld"`` ([B, H, L, D], SDPA's) and ``"blhd"`` ([B,
L, H, D]) read through strides, no copies, as long as the last dim is contiguous.

Modules: :mod:`.api` (entry point, checks, autograd), :mod:`.config` (typed configurations and the rules
choosing them), :mod:`.launch` (launchers), :mod:`.plans` (launching and launch plans), :mod:`.copies`
(float32's copies with unit stride on L), :mod:`.kernels_fwd`, :mod:`.kernels_bwd`,
:mod:`.kernels_common` (Triton kernels), :mod:`.gluon_fwd`, :mod:`.gluon_bwd`, :mod:`.gluon_common`,
:mod:`.gluon_launch` (float32 Gluon kernels).
"""

# ruff: noqa: F401  (the names code outside the package uses, re-exported)
from __future__ import annotations

from .api import (
    _EAGER,
    ReLUAttentionFunction,
    _attention_bwd,
    _attention_fwd,
    _check_attention_args,
    _eager_key,
    _operator_bwd,
    _operator_fwd,
    _to_bhld,
    _unit_d,
    clear_eager,
    relu_attention,
    relu_attention_with,
)
from .config import (
    CAUSAL_TAIL_BYTES,
    DEFAULT,
    FEW_PROGRAMS_TILE,
    GROUP_PROGRAMS,
    HEAD_DIMS,
    L_MAJOR_TILE,
    LAYOUTS,
    LONGEST_L,
    MAX_GRID_1,
    OVERRIDES,
    SHORT_L,
    TABLES,
    TF32_BWD,
    TF32_BWD_LONGEST,
    TF32_FWD,
    TUNED_H100,
    TUNED_H200,
    AttnConfig,
    Choices,
    Tf32BwdTiles,
    Tf32Tiles,
    _causal_order,
    _fold,
    _peel,
    _relu_cvt,
    _tf32_copies,
    attention_config,
    few_programs,
    fit_shared,
    rule_config,
    shared_bytes,
    tables_for,
    tf32_bwd_tiles,
)
from .copies import _l_contiguous, _l_major_copies, _l_major_copy_kernel, sigma_rows
from .kernels_bwd import (
    _relu_attn_bwd_dkdv_kernel,
    _relu_attn_bwd_dkdv_tma_kernel,
    _relu_attn_bwd_dq_kernel,
    _relu_attn_bwd_dq_tma_kernel,
)
from .kernels_fwd import _relu_attn_fwd_kernel, _relu_attn_fwd_tma_kernel
from .launch import _batch_slices, _desc, _tma_usable, relu_attention_bwd, relu_attention_fwd
from .plans import (
    _PLANS,
    _STAGES_THAT_FIT,
    MAX_PLANS,
    Plan,
    Step,
    _launch,
    _make_plan,
    _replay,
    _Tensor,
    clear_plans,
)
