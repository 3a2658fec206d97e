"""Fused layer norm in Triton: forward, and backward for dx, dw and db.

Formula (torch's ``layer_norm``, normalising over the last dim of a (M, N) view of the input)::

    mean = sum(x) / N
    var  = sum((x - mean)^2) / N                    (biased; corrected two-pass: no cancellation,
                                                     and the mean's rounding is corrected too)
    rstd = 1 / sqrt(var + eps)                      (eps inside the square root)
    y    = (x - mean) * rstd * w + b                (w, b each optional)

    xhat = (x - mean) * rstd,   g = dy * w
    dx   = rstd * (g - xhat * mean(g * xhat) - mean(g))
    dw   = sum over rows of dy * xhat,   db = sum over rows of dy

Design:

* Forward, N <= FUSED_MAX_N: each program normalises a tile of BLOCK_M rows x BLOCK_N columns held in
  registers (small N gets several rows per program so every program moves enough bytes). It stores
  the float32 mean and rstd of each row for the backward. A config may make the grid persistent
  (``programs_per_sm > 0``: programs loop over tiles), and may have each iteration load the next tile
  before it reduces its own (``prefetch``: two tiles' loads in flight per program); the measured
  tables (``TABLES``, per GPU model) use both kinds of grid. Where a table says ``shifted`` (16-bit
  inputs), a tile's statistics take one block reduction about each row's first element instead of two
  (``_ln_fwd_tile``).
* Backward, N <= FUSED_MAX_N: a persistent grid of about ``programs_per_sm`` programs per SM; each
  walks row tiles with a stride of the grid size (loading the next tile before reducing the current
  one, where the table says ``prefetch``), writes dx, and keeps its partial sums of dw and db in
  float32 registers; it writes them once to a (programs, N) float32 buffer that a second small kernel
  reduces and casts (fewer programs when M is small, so the partials stay under an eighth of the
  traffic). That reduction runs on 128 or more programs of a few columns each, so that each makes one or
  two L2 round trips (``reduce_tile``). No locks, no atomics: the result does not depend on scheduling.
* The backward allocates what torch's does (dx, dw, db) and nothing more: the partials (and the split
  backward's row sums) are kept in the bytes of the last R rows of dx, whose dx the main kernels do not
  store (they still add those rows to dw and db); after the reduction a last launch writes those rows'
  dx over the partials (``.launch_bwd``): after the grouped kernel, from the row sums it posted
  (``_ln_bwd_finish_kernel``), else by a second pass over each row. Only where R would exceed a quarter
  of the rows (few rows) do the partials get a buffer of their own.
* On compute capability 9+ a persistent config may read x (and dy) through tensor descriptors instead
  (``tma_stages``: the copy engine fills shared-memory buffers that Triton pipelines over the tile
  loop, so the tiles in flight cost no registers), where the rows are 16-byte aligned.
* N > FUSED_MAX_N (up to MAX_N): the row does not fit in registers. Forward ("chunked") loops over
  the row three times, each thread summing its own elements of every chunk (one reduction per pass):
  the mean, the centred sums of the corrected two-pass variance, then normalise and write (the second
  and third reads hit L2: the first two passes load with ``evict_last``, the output streams past L2);
  or, where the table says ``shifted``, twice (``_ln_fwd_shifted_kernel``): sums about the row's first
  element, taken again about the mean they give where that element lies more than 4 standard deviations
  from it (1 in float32 and float64: ``shifted_max_ratio``), so that their cancellation stays bounded for
  any row, then normalise. N is a compile-time constant
  of these kernels, so their chunk loops have known trip counts (the compiler unrolls them and folds the
  masks; they compile once per N): with it, the chunked kernel became the fastest forward at most N
  from 4096 to 16384.
  Backward ("split") computes the two row sums in one kernel, then a 2-D grid over (column chunks,
  row groups) writes dx and partial dw/db; or ("coop", where the table says so) one kernel whose
  programs hold column slabs of a row group, exchange their shares of the row sums and wait for each
  other, reading x and dy once (GPU only with more than one slab: the interpreter runs one program at a
  time, so there the split backward stands in). The tuning table picks these for long rows below
  FUSED_MAX_N too, where one whole row per program leaves too little in flight. In 16 bits with
  N = 4096 to 16384 (a power of 2) the table picks ("smem_rows") a Gluon kernel instead,
  ``.gluon_bwd``: one program per SM brings each row into shared memory with the copy
  engine and reads it from there twice, its float32 dw/db sums in registers, so x and dy are read once
  (compute capability 9+; elsewhere, and under the interpreter, SMEM_ROWS_FALLBACK's Triton kernels).
  For N = 16384, in 16 bits and float32, the entries split each row between a group of ``slices``
  programs (the grouped Gluon kernel of the same module): each keeps a slice's dw and db only, so the
  float32 partials in dx's last rows, and the rows computed again over them, shrink ``slices`` times;
  the programs of a group exchange their shares of the row sums through L2. In 16 bits the groups are
  of 8 programs of 2 warps, 6 an SM: independent programs that do not wait at each other's barriers;
  and two groups add their partials into one row (``paired``: the second of the two to end adds the
  first's, a + b being b + a, so the result still does not depend on scheduling), halving them again.
* On compute capability 9+ the backward's kernels after the first are programmatic dependent launches:
  each starts while the one before it ends (every kernel signals its dependents when it starts) and
  waits for it (``griddepcontrol.wait``) just before it reads that kernel's results or writes what it
  reads, so no launch gap sits between them; the results are those of plain launches, bit for bit.
* Statistics and accumulation are float32 for float32/float16/bfloat16 inputs, and float64 for
  float64 inputs (so ``torch.autograd.gradcheck`` can check the kernels).
* Under torch.compile the autograd function calls the launchers through custom operators
  (``torch.ops.crossfuse.layer_norm_fwd_shaped``/``layer_norm_bwd``, see ``_library``), which the
  tracer does not enter.
* Under Triton's interpreter (the CPU) the launches take few programs with large tiles
  (``interpreter_config``): the interpreter runs each program serially with numpy on its tiles, so the
  GPU's launch shapes would cost a minute at 1024x1024.
* An eager call is a dictionary look-up and the launches: every decision above depends only on the
  tensors' shapes, strides, dtypes, alignment and device and on the flags, so it is made once per such key
  and kept in a launch plan (``.plan``), whose launches go straight into the compiled kernels.
* The number of rows M is never a compile-time constant or specialised on (``do_not_specialize``),
  so a new batch size reuses the compiled kernels; tile shapes depend on N, the dtype and the row

The package, by responsibility: :mod:`.api` (``layer_norm``, its checks, the autograd.Function and the
eager calls' plans), :mod:`.config` (the typed launch configuration, the measured tables, the rules),
:mod:`.plan` (launch plans and their launches), :mod:`.launch` and :mod:`.launch_bwd` (the forward's and
backward's plans and launchers), :mod:`.kernels_fwd`, :mod:`.kernels_bwd`, :mod:`.kernels_finish` and
:mod:`.kernels_common` (the Triton kernels), :mod:`.gluon_bwd` (the Gluon backward of long rows).

Limits: last dim 1 <= N <= MAX_N; float32, float16, bfloat16 (float64 for checking); rows may be
strided (any row stride, unit column stride) and are read without a copy when ``reshape`` gives a view.
"""

from . import gluon_bwd
from .api import (
    SUPPORTED_DTYPES,
    LayerNormFunction,
    _operator_bwd,
    _operator_fwd,
    _operator_fwd_shaped,
    clear_plans,
    layer_norm,
)
from .config import (
    FUSED_MAX_N,
    MANY_ROWS,
    MAX_N,
    OVERRIDES,
    PADDED_ROWS,
    SMEM_ROWS_FALLBACK,
    TABLES,
    TUNED_H100,
    TUNED_H200,
    FewRowsConfig,
    FinishConfig,
    LaunchConfig,
    PaddedRows,
    backward_programs,
    interpreter_config,
    launch_config,
    reduce_tile,
    rule_config,
    shifted_max_ratio,
    smem_rows_fallback,
    tables_for,
)
from .launch import layer_norm_fwd
from .launch_bwd import finish_from_shares, layer_norm_bwd, reduce_partials

__all__ = [
    "FUSED_MAX_N",
    "MANY_ROWS",
    "MAX_N",
    "OVERRIDES",
    "PADDED_ROWS",
    "SMEM_ROWS_FALLBACK",
    "SUPPORTED_DTYPES",
    "TABLES",
    "TUNED_H100",
    "TUNED_H200",
    "FewRowsConfig",
    "FinishConfig",
    "LaunchConfig",
    "LayerNormFunction",
    "PaddedRows",
    "_operator_bwd",
    "_operator_fwd",
    "_operator_fwd_shaped",
    "backward_programs",
    "clear_plans",
    "finish_from_shares",
    "gluon_bwd",
    "interpreter_config",
    "launch_config",
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "reduce_partials",
    "reduce_tile",
    "rule_config",
    "shifted_max_ratio",
    "smem_rows_fallback",
    "tables_for",
]
