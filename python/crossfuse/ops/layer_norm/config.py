"""Launch configurations of the layer norm: the typed configuration, the measured tables and the rules.

Everything here depends on the row length N, the dtype and the row regime (few or many rows) only, never
on a tensor: the launchers (:mod:`.launch`) read it once per plan key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass

import torch
import triton

from ... import _tuning
from .._runtime.device import Card, first_entry, tables_in_order

FUSED_MAX_N = 16384  # largest row kept whole in registers
# the split backward's row-sums kernel: columns per chunk (8 warps, N a compile-time constant up to
# FUSED_MAX_N: 3713 GB/s at bf16 4096x16384 against 3539 for the table's 2048-column chunks with a
# runtime N)
ROWSUMS_BLOCK_N = 1024
MAX_N = 1 << 18  # largest supported row (chunked kernels above FUSED_MAX_N)

# Rows at which the "many rows" entries of the tables take over from the "few rows" ones: with few rows a
# grid of one program per tile leaves SMs idle or short of bytes in flight, and launch and tail costs
# weigh more, so the two regimes have different fastest tiles. A kernel compiles at most once per
# (N, dtype, regime): the row count is never specialised on.
MANY_ROWS = 8192


@dataclass(frozen=True)
class LaunchConfig:
    """How one pass of the layer norm is launched: tile, warps, grid and the kernel variant."""

    block_m: int  # rows per tile
    block_n: int  # columns per tile (the whole row when N <= FUSED_MAX_N)
    num_warps: int
    # persistent programs per SM; 0 = one program per row tile (forward only)
    programs_per_sm: int = 1
    _: KW_ONLY
    unroll: int = 1  # tiles (or chunks, chunked forward) per loop iteration: tl.range's loop_unroll_factor
    # persistent loops: each iteration loads the next row tile before it reduces its own, so a program
    # keeps two tiles' loads in flight (costing the next tile's registers, in the input's dtype)
    prefetch: bool = False
    # forward: weight and bias loaded with the first tile, before the row statistics (and kept in
    # registers by persistent grids), instead of after the statistics of every tile (fewer registers,
    # but an L1/L2 round trip between each tile's statistics and its store)
    keep_params: bool = False
    # forward: the row statistics summed about each row's first element, then a second time only where
    # that lies far from the mean (shifted_max_ratio). Chunked forward: two passes over the row instead
    # of three (_ln_fwd_shifted_kernel); whole rows of 16-bit inputs through pointers: one block
    # reduction instead of two (_ln_fwd_tile); float32, float64 and the descriptor (tma_stages) forward
    # of whole rows ignore it
    shifted: bool = False
    # whole-row kernels on a persistent grid: 0 = x (and dy) loaded through pointers; k >= 2 = through
    # tensor descriptors (the copy engine, TMA) into k shared-memory buffers, where the rows allow
    tma_stages: int = 0
    # backward: column slabs of block_n whose programs exchange their shares of each row tile's two row
    # sums and wait for each other, so that x and dy are read once (the split backward reads them twice);
    # with block_n >= N, one slab that waits for nobody
    coop: bool = False
    # backward: the Gluon kernel that brings each whole row into shared memory and reads it from there
    # twice (.gluon_bwd), launched with num_warps, tma_stages row buffers and programs_per_sm; where it
    # cannot run, the entry of SMEM_ROWS_FALLBACK
    smem_rows: bool = False
    # with smem_rows: each row split between a group of `slices` programs (the grouped Gluon kernel),
    # each streaming its slice of the rows through tma_stages buffers and finishing a row `lag` rows
    # after posting its shares of the row's sums; 1 = whole rows
    slices: int = 1
    lag: int = 1
    # with slices > 1: groups 2k and 2k + 1 add their dw and db partials into one row (the second of the
    # two programs to end adds the first's), halving the partials and the scratch rows of dx finished
    # after them
    paired: bool = False

    def replace(self, **changes) -> LaunchConfig:
        """This configuration with ``changes`` (field name: value)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class FinishConfig:
    """How the grouped backward's scratch rows get their dx from the row sums the grouped kernel posted
    (``_ln_bwd_finish_kernel``)."""

    tile_bytes: int = 8192  # of x (and dy, dx) per program
    hot_rows: int = 4  # a power of 2: at most this many rows of tiles for the last program (else two-pass)


FINISH = FinishConfig()


@dataclass(frozen=True)
class FewRowsConfig:
    """The backward where its dw/db partials would need a buffer of their own (few rows: see
    :mod:`.kernels_few`): one launch whose first programs each sum a column block of dw and db over every
    row, the others writing dx. It reads x and dy twice where the partials' way reads them once, so it
    takes the rows where that second read is short (:meth:`takes`); elsewhere the partials get their own
    buffer."""

    # x of at most max_bytes, or at most short_rows rows of any length, and never over max_rows rows. On
    # an H100 against the partials' own buffer, at the 62 probed shapes (bf16, fp32; 1 to 2000 rows of 256
    # to 65536) it takes: GPU time 0.57-0.99x at 57, 1.03-1.36x at five of 1000-2000 rows of 2560-8192
    # columns; eager time 0.37-1.09x (a launch and an allocation less). Above 16 MB at 1000-2000 rows, GPU
    # time 1.27-1.31x and eager 0.75-1.21x: the partials' way there
    max_bytes: int = 16 << 20
    short_rows: int = 128
    max_rows: int = 4096
    col_tile: int = 8192  # elements of a column program's tile
    max_col_n: int = 64  # widest column block (narrower until there are about as many blocks as SMs)
    row_tile: int = 4096  # elements of a row program's tile of whole rows, or its chunk of a longer row
    num_warps: int = 8

    def takes(self, m: int, row_bytes: int) -> bool:
        """Whether the few-rows kernel takes ``m`` rows of ``row_bytes`` whose partials dx cannot hold."""
        return m <= self.max_rows and (m <= self.short_rows or m * row_bytes <= self.max_bytes)


FEW_ROWS = FewRowsConfig()


@dataclass(frozen=True)
class PaddedRows:
    """16-bit rows past 4096 whose length is a multiple of 4 but not of 16 elements. Triton specialises an
    integer argument on its divisibility by 16, so in the tables' kernels the row stride carries no
    alignment and their accesses are not vectorised (compiled for sm_90, the chunked forward at 5000
    columns stores in 2-byte pieces: 24 st.global.b16 where 5008 columns take three 16-byte stores); their
    entries, measured at powers of two, lose there. On an H100, against the tables' entries (GPU time, the
    same run), at 4096 and 16384 rows: the forward in chunks of 1024 read twice (``shifted``) 1.13-1.36x
    at 4500, 5000, 9000 and 11000 columns (0.98-1.11x at 1000 rows; at 1 to 128 rows the grid's GPU times
    are 5-10% above earlier runs' of the tables' entries, under host times several times longer); the
    whole-row backward on 32 warps, one program an SM, through tensor descriptors where the rows allow
    (5000) and pointers where not (4500), 1.03-1.22x at 4500 and 5000 (1.00-1.01x at 1000 rows), but
    0.50-0.56x at 9000 and 11000, which keep the tables. At eleven multiples of 16 from 4608 to 10000 the
    tables' entries were as fast or faster (forward 0.93-1.00x for these configurations, backward
    0.46-0.95x), so those keep them; odd lengths and those of 2 modulo 4 were not measured and keep them
    too. Keyed on N as the tables are, so a view whose row stride is a multiple of 16 takes it as well.
    Used on the cards the tables serve, after the user's overrides and before the tables; the cause lies
    in the compiled code, not the card, but only the H100 measured it."""

    min_n: int = 4097
    fwd_max_n: int = FUSED_MAX_N
    bwd_max_n: int = 8192
    divisor: int = 16  # Triton's integer specialisation
    measured_divisor: int = 4  # lengths of no multiple of this were not measured
    fwd_block_n: int = 1024
    fwd_warps: int = 8
    fwd_unroll: int = 2
    bwd_warps: int = 32
    bwd_stages: int = 3

    def takes(self, n: int, esize: int, kind: str) -> bool:
        """Whether rows of ``n`` elements of ``esize`` bytes take this configuration for ``kind``."""
        top = self.fwd_max_n if kind == "fwd" else self.bwd_max_n
        measured = n % self.divisor != 0 and n % self.measured_divisor == 0
        return esize == 2 and measured and self.min_n <= n <= top

    def config(self, n: int, kind: str) -> LaunchConfig:
        """The configuration of ``kind`` for rows of ``n`` elements that :meth:`takes` takes."""
        if kind == "fwd":
            return LaunchConfig(1, self.fwd_block_n, self.fwd_warps, 0, unroll=self.fwd_unroll, shifted=True)
        return LaunchConfig(1, triton.next_power_of_2(n), self.bwd_warps, 1, tma_stages=self.bwd_stages)


PADDED_ROWS = PaddedRows()


# The tables, measured by bench/tune.py, each on the card it is named after: the fastest by median GPU
# time, "few rows" at M=4096 and "many rows" at M*N=128M elements (M >= 16384); where a later sweep kept an
# earlier entry, the entry stayed. (kind, element bytes, next_power_of_2(N), many rows) -> config; a config
# whose block_n is below N runs the chunked forward or the split backward; float16 uses the bfloat16 rows.
# A card reads its own model's table, then the other models' (see tables_for), then the rule in
# launch_config. The GB/s figures are those of the sweep that chose the entry.
Key = tuple[str, int, int, bool]
_C = LaunchConfig
TUNED_H200: dict[Key, LaunchConfig] = {
    ("bwd", 2, 1024, False): _C(2, 1024, 4, 1, prefetch=True),  # 1120 GB/s
    ("bwd", 2, 1024, True): _C(2, 1024, 4, 4, tma_stages=3),  # 3562 GB/s
    ("bwd", 2, 2048, False): _C(2, 2048, 8, 1, prefetch=True),  # 1785 GB/s
    ("bwd", 2, 2048, True): _C(2, 2048, 8, 2, tma_stages=3),  # 3676 GB/s
    ("bwd", 2, 4096, False): _C(2, 4096, 16, 4, tma_stages=3),  # 2056 GB/s
    # the Gluon kernel that reads each row once (smem_rows; the Triton entry it replaced in brackets); the
    # many-rows entry of 16384 is the few-rows winner (timed at 8192 rows there)
    ("bwd", 2, 4096, True): _C(1, 4096, 8, 2, tma_stages=3, smem_rows=True),  # 3973 GB/s (3806)
    ("bwd", 2, 8192, False): _C(1, 8192, 8, 1, tma_stages=3, smem_rows=True),  # 3054 GB/s (2732)
    ("bwd", 2, 8192, True): _C(1, 8192, 8, 1, tma_stages=3, smem_rows=True),  # 4001 GB/s (3600)
    # each row split between the eight programs of a group (the grouped Gluon kernel), six programs of 2
    # warps an SM (the shares spread over the lanes: 168 registers a thread instead of 255, so six fit:
    # 1.035x four at bf16 4096x16384 and 1.074x at 8192x16384, alternated), 4 buffers each, a row finished
    # 2 rows after its sums; groups paired (half the partials and scratch rows) and launched after the
    # memset as a dependent launch: 1.039x unpaired at 4096x16384, 1.019x at 8192x16384; 3451 GB/s at
    # 4096x16384, 81.2% of copy
    ("bwd", 2, 16384, False): _C(1, 16384, 2, 6, tma_stages=4, smem_rows=True, slices=8, lag=2, paired=True),
    ("bwd", 2, 16384, True): _C(1, 16384, 2, 6, tma_stages=4, smem_rows=True, slices=8, lag=2, paired=True),
    ("bwd", 4, 1024, False): _C(4, 1024, 8, 1, tma_stages=3),  # 2111 GB/s
    ("bwd", 4, 1024, True): _C(4, 1024, 8, 1, tma_stages=3),  # 4044 GB/s
    ("bwd", 4, 2048, False): _C(4, 2048, 16, 1, prefetch=True),  # 2314 GB/s
    ("bwd", 4, 2048, True): _C(2, 2048, 8, 1, tma_stages=3),  # 4049 GB/s
    ("bwd", 4, 4096, False): _C(1, 4096, 8, 1, tma_stages=3),  # 3256 GB/s
    ("bwd", 4, 4096, True): _C(1, 4096, 8, 1, tma_stages=3),  # 4057 GB/s
    ("bwd", 4, 8192, False): _C(1, 8192, 16, 1),  # 3361 GB/s
    ("bwd", 4, 8192, True): _C(1, 8192, 16, 1),  # 3941 GB/s
    # the grouped Gluon kernel, two programs a row, 3 buffers: 3831 GB/s against the cooperative entry's
    # 3286 at 4096x16384, 4033 against 3406 at 8192x16384 (alternated in one process); paired: 1.003x,
    # 1.001x
    ("bwd", 4, 16384, False): _C(1, 16384, 8, 1, tma_stages=3, smem_rows=True, slices=2, lag=1),
    ("bwd", 4, 16384, True): _C(1, 16384, 8, 1, tma_stages=3, smem_rows=True, slices=2, lag=1),
    # statistics about each row's first element: 1.026x the same launch without
    ("fwd", 2, 1024, False): _C(2, 1024, 2, 0, keep_params=True, shifted=True),  # 1824 GB/s
    ("fwd", 2, 1024, True): _C(2, 1024, 2, 0, keep_params=True),  # 4004 GB/s
    ("fwd", 2, 2048, False): _C(1, 2048, 4, 8, prefetch=True),  # 2416 GB/s
    ("fwd", 2, 2048, True): _C(1, 2048, 2, 0),  # 4019 GB/s
    # the shifted chunked kernel: 3178 GB/s against the whole-row entry's 3015, 1.054x alternated
    ("fwd", 2, 4096, False): _C(1, 2048, 4, 0, unroll=2, shifted=True),
    ("fwd", 2, 4096, True): _C(1, 2048, 4, 0, unroll=2),  # 4135 GB/s
    # the shifted kernel summing about the row's first element: 1.026x the three-pass entry (3487 GB/s)
    ("fwd", 2, 8192, False): _C(1, 2048, 8, 0, unroll=2, shifted=True),  # 3551 GB/s
    ("fwd", 2, 8192, True): _C(1, 4096, 4, 0, unroll=2),  # 4101 GB/s
    # unrolled twice: 3893 and 4238 GB/s against 3855 and 4194, 1.007-1.008x alternated
    ("fwd", 2, 16384, False): _C(1, 4096, 16, 0, unroll=2, shifted=True),
    ("fwd", 2, 16384, True): _C(1, 4096, 16, 0, unroll=2, shifted=True),
    ("fwd", 4, 1024, False): _C(4, 1024, 4, 4, prefetch=True, keep_params=True),  # 2589 GB/s
    ("fwd", 4, 1024, True): _C(1, 1024, 4, 0, keep_params=True),  # 4163 GB/s
    ("fwd", 4, 2048, False): _C(2, 2048, 4, 4, prefetch=True, keep_params=True),  # 3062 GB/s
    ("fwd", 4, 2048, True): _C(2, 2048, 16, 0),  # 4119 GB/s
    # the chunked kernel, as with many rows: 3628 GB/s against the whole-row (2, 4096, 8, 0, keep_params)'s
    # 3539, alternated under the timer that resets persisting L2 lines (the timer before it had flattered
    # whole-row kernels measured after the chunked one)
    ("fwd", 4, 4096, False): _C(1, 2048, 8, 0, unroll=2),
    ("fwd", 4, 4096, True): _C(1, 2048, 8, 0, unroll=2),  # 4210 GB/s
    ("fwd", 4, 8192, False): _C(1, 4096, 16, 0, unroll=2),  # 3897 GB/s
    ("fwd", 4, 8192, True): _C(1, 4096, 16, 0, unroll=2),  # 4227 GB/s
    ("fwd", 4, 16384, False): _C(1, 8192, 8, 0, unroll=2),  # 4048 GB/s
    # the shifted kernel: 1.043x the three-pass entry (4061 GB/s)
    ("fwd", 4, 16384, True): _C(1, 4096, 32, 0, unroll=2, shifted=True),  # 4260 GB/s
}

# Measured on the H100. Rows of 64 to 512 elements (bench/tune.py --only ln-narrow): many rows a tile. The
# backward's entries come from a sweep of the backward alone with dw and db summed per row slot (--kind bwd
# --base code), which found bf16's earlier tiles 1.19-1.25x slower at many rows; the backward's rule took 342
# GB/s at bf16 262144x512, 347 at 524288x256 (now bm = 1024 // N).
TUNED_H100: dict[Key, LaunchConfig] = {
    ("bwd", 2, 64, False): _C(32, 64, 4, 4),  # 170 GB/s
    ("bwd", 2, 64, True): _C(32, 64, 4, 4),  # 2847 GB/s
    ("bwd", 2, 128, False): _C(16, 128, 4, 4),  # 281 GB/s
    ("bwd", 2, 128, True): _C(16, 128, 4, 4),  # 2836 GB/s
    ("bwd", 2, 256, False): _C(8, 256, 4, 4),  # 428 GB/s
    ("bwd", 2, 256, True): _C(8, 256, 4, 4),  # 2796 GB/s
    ("bwd", 2, 512, False): _C(4, 512, 4, 1, tma_stages=3),  # 753 GB/s
    ("bwd", 2, 512, True): _C(4, 512, 4, 4),  # 2764 GB/s
    ("bwd", 4, 64, False): _C(16, 64, 4, 4),  # 340 GB/s
    ("bwd", 4, 64, True): _C(16, 64, 4, 4),  # 2945 GB/s
    ("bwd", 4, 128, False): _C(8, 128, 2, 4),  # 547 GB/s
    ("bwd", 4, 128, True): _C(16, 128, 8, 2),  # 2940 GB/s
    ("bwd", 4, 256, False): _C(8, 256, 4, 4),  # 910 GB/s
    ("bwd", 4, 256, True): _C(32, 256, 16, 1),  # 2933 GB/s
    ("bwd", 4, 512, False): _C(4, 512, 4, 4),  # 1361 GB/s
    ("bwd", 4, 512, True): _C(16, 512, 16, 1),  # 2953 GB/s
    ("fwd", 2, 64, False): _C(64, 64, 16, 0),  # 224 GB/s
    ("fwd", 2, 64, True): _C(32, 64, 8, 0),  # 2884 GB/s
    ("fwd", 2, 128, False): _C(16, 128, 8, 0),  # 410 GB/s
    ("fwd", 2, 128, True): _C(16, 128, 4, 0),  # 2906 GB/s
    ("fwd", 2, 256, False): _C(16, 256, 16, 0),  # 708 GB/s
    ("fwd", 2, 256, True): _C(8, 256, 4, 0),  # 2926 GB/s
    ("fwd", 2, 512, False): _C(2, 512, 2, 0),  # 1120 GB/s
    ("fwd", 2, 512, True): _C(8, 512, 8, 0),  # 2926 GB/s
    ("fwd", 4, 64, False): _C(8, 64, 2, 0),  # 412 GB/s
    ("fwd", 4, 64, True): _C(128, 64, 16, 0),  # 2962 GB/s
    ("fwd", 4, 128, False): _C(8, 128, 4, 0),  # 724 GB/s
    ("fwd", 4, 128, True): _C(64, 128, 16, 0),  # 2988 GB/s
    ("fwd", 4, 256, False): _C(2, 256, 1, 0),  # 1125 GB/s
    ("fwd", 4, 256, True): _C(32, 256, 16, 0),  # 2997 GB/s
    ("fwd", 4, 512, False): _C(2, 512, 4, 0),  # 1759 GB/s
    ("fwd", 4, 512, True): _C(8, 512, 16, 0),  # 2997 GB/s
    # Rows past FUSED_MAX_N (bench/tune.py --only ln-long): few rows timed at 1000 and 4096 rows (the best
    # geometric mean), many at 16384x32768. Against the rule's chunks of 4096 (split backward) in the same
    # sweep, GPU time: backward 1.86-2.88x faster, forward 1.18-1.85x. The backward is the grouped Gluon
    # kernel with 8 or 16 programs a row (2482, 2927, 2634 GB/s in bf16 and 2768, 2938, 2865 in float32, in
    # the order below); the forward, chunks of 8192-16384 on 32 warps.
    ("bwd", 2, 32768, False): _C(1, 32768, 2, 4, tma_stages=4, smem_rows=True, slices=16, lag=2, paired=True),
    ("bwd", 2, 32768, True): _C(1, 32768, 4, 2, tma_stages=4, smem_rows=True, slices=8, lag=2, paired=True),
    ("bwd", 2, 65536, False): _C(1, 65536, 2, 4, tma_stages=3, smem_rows=True, slices=16, lag=1, paired=True),
    ("bwd", 4, 32768, False): _C(1, 32768, 4, 4, tma_stages=3, smem_rows=True, slices=16, lag=1, paired=True),
    ("bwd", 4, 32768, True): _C(1, 32768, 2, 2, tma_stages=4, smem_rows=True, slices=16, lag=2, paired=True),
    ("bwd", 4, 65536, False): _C(1, 65536, 4, 2, tma_stages=3, smem_rows=True, slices=16, lag=1, paired=True),
    ("fwd", 2, 32768, False): _C(1, 8192, 32, 0, shifted=True),  # 2758 GB/s
    ("fwd", 2, 32768, True): _C(1, 8192, 32, 0, unroll=2, shifted=True),  # 3035 GB/s
    ("fwd", 2, 65536, False): _C(1, 16384, 32, 0, shifted=True),  # 2823 GB/s
    ("fwd", 4, 32768, False): _C(1, 16384, 32, 0, unroll=2),  # 2870 GB/s
    ("fwd", 4, 32768, True): _C(1, 16384, 32, 0, unroll=2),  # 3047 GB/s
    ("fwd", 4, 65536, False): _C(1, 16384, 32, 0, shifted=True),  # 2644 GB/s
}

# by the model named in the driver's device name (crossfuse.ops._runtime.device.Card.model)
TABLES: dict[str, dict[Key, LaunchConfig]] = {"H200": TUNED_H200, "H100": TUNED_H100}
# entries of CROSSFUSE_TUNED_CONFIGS (measured on the user's own card): first on every card
OVERRIDES: dict[Key, LaunchConfig] = _tuning.layer_norm_overrides(LaunchConfig)

# Where the Gluon kernels of the smem_rows entries cannot run (a GPU before compute capability 9, a
# Triton without Gluon, rows that are not contiguous): the Triton kernels' entries they replaced.
SMEM_ROWS_FALLBACK: dict[Key, LaunchConfig] = {
    ("bwd", 2, 4096, True): _C(2, 4096, 16, 1, tma_stages=3),  # 3680 GB/s
    ("bwd", 2, 8192, False): _C(1, 8192, 16, 4, prefetch=True),  # 2521 GB/s
    ("bwd", 2, 8192, True): _C(1, 8192, 16, 1, tma_stages=3),  # 3522 GB/s
    ("bwd", 2, 16384, False): _C(2, 2048, 8, 2, prefetch=True),  # 2159 GB/s
    ("bwd", 2, 16384, True): _C(2, 2048, 8, 2, prefetch=True),  # 2477 GB/s
    ("bwd", 4, 16384, False): _C(2, 4096, 16, 1, prefetch=True, coop=True),  # 3153 GB/s
    ("bwd", 4, 16384, True): _C(2, 4096, 16, 1, prefetch=True, coop=True),  # 3437 GB/s
}
del _C


def smem_rows_fallback(cfg: LaunchConfig, n: int, esize: int, m: int) -> LaunchConfig:
    """The Triton kernels' configuration that takes the place of the Gluon entry ``cfg`` (``smem_rows``)
    where that kernel cannot run: SMEM_ROWS_FALLBACK's entry for its key, else the rule."""
    return SMEM_ROWS_FALLBACK.get(("bwd", esize, cfg.block_n, m > MANY_ROWS)) or rule_config(n, "bwd")


def _check_kind(kind: str) -> None:
    if kind not in ("fwd", "bwd"):
        raise ValueError(f"kind must be 'fwd' or 'bwd', got {kind!r}")


def tables_for(card: Card | None) -> tuple[dict[Key, LaunchConfig], ...]:
    """The tables ``card`` reads, first to last (:func:`.._runtime.device.tables_in_order`): the user's
    overrides, its model's, the other models'; on a card of another architecture the overrides and then
    the rule."""
    return tables_in_order(card, OVERRIDES, TABLES)


def launch_config(
    n: int, dtype: torch.dtype, kind: str, m: int | None = None, card: Card | None = None,
    padded: PaddedRows = PADDED_ROWS,
) -> LaunchConfig:
    """Tile shape, warps and grid for rows of length ``n`` (``m`` rows, when known) on ``card`` (see
    :func:`tables_for`); ``kind`` is ``"fwd"`` or ``"bwd"``. The first table with an entry for the row
    regime, or else for the other regime, gives it, except that on the cards the tables serve the rows
    ``padded`` takes (:class:`PaddedRows`) get its configuration unless the user's overrides have an
    entry; where no table has one, the rule (:func:`rule_config`). Rows past FUSED_MAX_N are keyed by their
    power of two as the shorter ones are (``bench/tune.py --only ln-long`` measures such entries: chunked
    forwards, split, cooperative or grouped backwards)."""
    _check_kind(kind)
    many = m is not None and m > MANY_ROWS
    key = (kind, dtype.itemsize, triton.next_power_of_2(n))
    if (card is None or card.tabled) and padded.takes(n, dtype.itemsize, kind):
        return first_entry((OVERRIDES,), key, many) or padded.config(n, kind)
    tuned = first_entry(tables_for(card), key, many)
    return rule_config(n, kind) if tuned is None else tuned


def rule_config(n: int, kind: str) -> LaunchConfig:
    """The configuration where no table has one: a tile of about 4096 elements per program (several rows
    when rows are short), one warp per 256 elements of the tile, 1 to 16 warps; a backward of rows up to
    512 long, tiles of 1024 elements on a warp per 512 and four programs an SM; rows longer than
    FUSED_MAX_N in chunks of 4096."""
    block_n = triton.next_power_of_2(min(n, FUSED_MAX_N)) if n <= FUSED_MAX_N else 4096
    if n > FUSED_MAX_N:
        return LaunchConfig(
            1 if kind == "fwd" else 4, block_n, 8 if kind == "fwd" else 4, 0 if kind == "fwd" else 2
        )
    if kind == "bwd" and block_n <= 512:  # short rows: small tiles, many programs (as measured, above)
        block_m = 1024 // block_n
        return LaunchConfig(block_m, block_n, max(1, block_m * block_n // 512), 4)
    target = 4096 if kind == "fwd" else 2048
    block_m = max(1, min(64, target // block_n))
    num_warps = max(1, min(16, block_m * block_n // 256))
    return LaunchConfig(block_m, block_n, num_warps, 0 if kind == "fwd" else 2)


# Under Triton's interpreter each program runs serially, every tile operation a numpy call on the whole
# tile: the cost is a fixed overhead per operation, nearly independent of the tile's size up to a few
# hundred thousand elements. So the GPU's launch shapes (many programs, tiles of a row or two, loops
# over row tiles) are the worst choice there; a tile of about INTERPRETER_TILE elements, one program per
# tile, is the best (1024x1024 float32 forward and backward: seconds instead of a minute).
INTERPRETER_TILE = 1 << 17


def interpreter_config(n: int, kind: str, m: int) -> LaunchConfig:
    """The launch of ``kind`` for ``m`` rows of ``n`` when the kernels run under Triton's interpreter: whole
    rows in tiles of about INTERPRETER_TILE elements, a program per tile (the forward), or one persistent
    program per interpreter "SM" (the backward: few partial rows of dw and db); long rows as on a GPU
    (their chunk loops already move large tiles)."""
    _check_kind(kind)
    if n > FUSED_MAX_N:
        return rule_config(n, kind)
    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(triton.next_power_of_2(max(m, 1)), INTERPRETER_TILE // block_n))
    return LaunchConfig(block_m, block_n, 4, 0 if kind == "fwd" else 1)


def backward_programs(cfg: LaunchConfig, m: int, esize: int, sms: int) -> int:
    """Persistent programs of the backward: ``programs_per_sm`` per SM, no more than there are tiles, and
    few enough that the float32 dw/db partials (written once, read once: 16 bytes per program and column)
    stay under an eighth of the 3·M·N·esize bytes the backward must move; a whole number of programs per
    SM, at least one (an SM with one program more than the others would set the time). The plan may take
    fewer where that lets the partials fit into dx (``launch_bwd.fitting_programs``)."""
    tiles = triton.cdiv(m, cfg.block_m)
    per_sm = max(1, min(cfg.programs_per_sm, (3 * m * esize) // (8 * 16 * sms)))
    return max(1, min(tiles, per_sm * sms))


def reduce_tile(n: int, acc_size: int, max_p: int, interpreted: bool = False) -> tuple[int, int, int]:
    """``(BLOCK_P, BLOCK_N, num_warps)`` of the dw/db reduction of at most ``max_p`` partial rows of
    ``n`` columns (``acc_size``-byte values). BLOCK_N: a power of 2 from 4 to 16 giving about 128
    programs up to n = 2048, more beyond (1024 at n = 16384: 1.01-1.02x the 256 of 64 columns at 4096
    rows). BLOCK_P: enough for two blocks to cover ``max_p`` rows, at most 16 KB of partials per block and
    tensor. Warps: 16 values per thread and tensor. The partials are a few MB at most, just written, so
    read from L2: what costs is each program's chain of round trips (one per 2 * BLOCK_P rows), so many
    programs, each with few trips. ``max_p`` depends on the configuration, not on the row count, so the
    kernel does not recompile as M changes. ``interpreted``: under Triton's interpreter, one program for
    up to INTERPRETER_TILE partials (see interpreter_config)."""
    if interpreted:
        block_p = max(1, triton.next_power_of_2(max_p) // 2)
        block_n = max(1, min(triton.next_power_of_2(n), INTERPRETER_TILE // (2 * block_p)))
        return block_p, block_n, 4
    per = max(1, n // 128)
    block_n = max(4, min(16, 1 << (per.bit_length() - 1)))
    block_p = max(8, min(16384 // acc_size // block_n, triton.next_power_of_2(max_p) // 2))
    return block_p, block_n, max(1, min(8, block_p * block_n * acc_size // 2048))


def shifted_max_ratio(dtype: torch.dtype) -> float:
    """The shifted forward's largest accepted (mean - shift)^2 / var (``_ln_fwd_shifted_kernel``, and
    ``_ln_fwd_tile`` for 16-bit inputs): its variance loses up to about 1 + R roundings of the float32
    (float64) sums. 16 for 16-bit inputs, whose output rounding (2^-8 or 2^-11) is far above that; 1 for
    float32 and float64, which keep about their three-pass accuracy (the second sums then serve about
    one Gaussian row in three, at no cost measured: float32 16384×16384, 4240 GB/s with 1, 4255 with 4,
    4064 three-pass; y within 6.5e-8 of float64 with 1, 1.3e-7 with 4, 5e-8 three-pass, against a
    tolerance of 2e-6)."""
    return 16.0 if dtype in (torch.bfloat16, torch.float16) else 1.0
