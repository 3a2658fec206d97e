"""The backward's launch plan and launcher.

The backward allocates what torch's does (dx, dw, db) and nothing more: the float32 partial sums of dw
and db (and the split backward's row sums, the cooperative kernel's shares, the grouped kernel's shares and
counters) live in the bytes of the last R rows of dx, whose dx the main kernels leave unwritten (they
still add those rows to dw and db, last, so that the rows are still in L2 for the end); after the partials
are reduced, a last launch writes the R rows' dx. Where R would exceed a quarter of the rows (few rows),
one launch of the few-rows kernel (:mod:`.kernels_few`) sums dw and db straight into their outputs instead
where it is the faster (``FewRowsConfig.takes``); elsewhere the whole-row backward takes fewer programs where
that lets the partials fit (:func:`fitting_programs`), and otherwise they get a buffer of their own.
Everything but the tensors is decided once per plan key.
"""

from __future__ import annotations

import math

import torch
import triton

from .._library import stats_dtype
from .._runtime import pdl as _gdc
from .._runtime.device import card_of, device_parallelism
from . import gluon_bwd
from .config import (
    FEW_ROWS,
    FINISH,
    FUSED_MAX_N,
    ROWSUMS_BLOCK_N,
    FewRowsConfig,
    FinishConfig,
    LaunchConfig,
    backward_programs,
    reduce_tile,
    smem_rows_fallback,
)
from .kernels_bwd import (
    _dwdb_reduce_kernel,
    _ln_bwd_coop_kernel,
    _ln_bwd_kernel,
    _ln_bwd_rowsums_kernel,
    _ln_bwd_split_kernel,
    _ln_bwd_tma_kernel,
)
from .kernels_few import _ln_bwd_few_kernel
from .kernels_finish import _ln_bwd_finish_kernel
from .launch import INTERPRETED, default_config, is_pow2, row_desc, tensor_key, tma_usable
from .plan import Launch, Plan, PlanCache, Zeroing


def align(n: int, k: int = 32) -> int:
    return triton.cdiv(n, k) * k


def scratch_rows(m: int, row_bytes: int, nbytes: int) -> tuple[int, int]:
    """``(R, start)``: ``nbytes`` from byte ``start`` (128-byte aligned) of an (m, ·) array of rows of
    ``row_bytes`` lie in its last R rows; ``(0, 0)`` when that would take more than a quarter of the rows
    (then the sums get a buffer of their own)."""
    start = (m * row_bytes - nbytes) // 128 * 128
    rows = m - start // row_bytes if start >= 0 else m + 1
    if rows > m // 4:
        return 0, 0
    return rows, start


def fitting_programs(programs: int, m: int, block_m: int, row_bytes: int, n: int, acc_size: int,
                     sums: int) -> int:  # fmt: skip
    """The whole-row backward's ``programs``, or the most programs below it whose ``sums`` (dw, db: 1 or 2)
    partial rows of ``n`` ``acc_size``-byte values fit into the last quarter of an (m, ·) dx of rows of
    ``row_bytes`` (:func:`scratch_rows`), where no program gets more than one tile more than it had: then
    the partials need no buffer of their own, and the backward's peak memory is torch's (float32
    1000×5000: 124 programs on an H100's 132 SMs, 9 rows a program at most instead of 8)."""
    if not sums:  # no partials
        return programs

    def fits(p: int) -> bool:
        return scratch_rows(m, row_bytes, sums * align(p * n) * acc_size)[0] > 0

    tiles = triton.cdiv(m, block_m)
    floor = max(1, triton.cdiv(tiles, triton.cdiv(tiles, programs) + 1))
    return next((p for p in range(programs, floor - 1, -1) if fits(p)), programs)


def gdc_usable(t: torch.Tensor) -> bool:
    """Whether the backward's kernels on ``t``'s device can chain by programmatic dependent launch
    (:mod:`crossfuse.ops._runtime.pdl`)."""
    return _gdc.usable(t, INTERPRETED)


def finish_plan(m: int, n: int, esize: int, R: int, at: int, slices: int, finish: FinishConfig = FINISH):
    """``(HOT_TILE, LAST_TILE, TILES, BLOCK_N, HOT_ROWS)`` of ``_ln_bwd_finish_kernel`` on the last ``R``
    rows of a contiguous (m, n) dx of ``esize``-byte elements whose bytes hold the grouped kernel's shares
    ((m, 2, slices) int64, then the counter) from its byte ``at`` on: the tile that holds the shares of row
    m - R on (HOT_TILE), those of the hot tiles' rows from LAST_TILE on; None where the tiles from LAST_TILE
    on would span more than ``finish.hot_rows`` rows (the two-pass kernel then)."""
    block_n = min(n, finish.tile_bytes // esize)
    per_row = n // block_n
    row0 = m - R
    at += row0 * 2 * slices * 8 - row0 * n * esize  # of the shares of row0, bytes past row0
    if at < 0 or n % block_n:
        return None
    hot_tile = at // (block_n * esize)
    first = row0 + hot_tile // per_row  # the first row with a hot tile
    last_tile = (at + (first - row0) * 2 * slices * 8) // (block_n * esize)
    if m - (row0 + last_tile // per_row) > finish.hot_rows:
        return None
    if hot_tile >= 1 << 23 or last_tile - hot_tile >= 1 << 7:  # Count's low 24 bits and its top byte
        return None
    # HOT_ROWS is finish.hot_rows whatever the rows the last program's tiles span (1 to 4 with the table's
    # entries, by the row count): a constexpr that followed them would compile the kernel again as M changes
    return hot_tile, last_tile, R * per_row, block_n, finish.hot_rows


def finish_launch(n: int, has_weight: bool, slices: int, launched: int, plan, order: dict):
    """``(launch, TARGET)`` of ``_ln_bwd_finish_kernel`` with ``plan`` (:func:`finish_plan`) after a grouped
    kernel of ``launched`` programs in groups of ``slices``."""
    hot_tile, last_tile, _, block_n, hot_rows = plan
    if launched + hot_tile >= 1 << 24:  # what Count's low bytes hold
        raise ValueError(f"finish_from_shares: {launched} programs and a plan of {plan} overflow the counter")
    run = Launch(_ln_bwd_finish_kernel, (last_tile + 1,), N=n, BLOCK_N=block_n, SLICES=slices,
                 HOT_ROWS=hot_rows, HAS_WEIGHT=has_weight, num_warps=4, **order)  # fmt: skip
    return run, launched + hot_tile


def finish_from_shares(dx, dy, x, weight, mean, rstd, shares, count, R: int, slices: int, launched: int, plan,
                       order: dict | None = None) -> None:  # fmt: skip
    """dx of the last ``R`` rows of the (M, N) ``dx`` from the row sums a grouped kernel of ``launched``
    programs in groups of ``slices`` posted in ``shares`` (its ticket counter ``count`` at ``launched``),
    with ``plan`` (:func:`finish_plan`); ``order``: the launch's grid dependency control."""
    M, N = dx.shape
    run, target = finish_launch(N, weight is not None, slices, launched, plan, order or {})
    hot_tile, last_tile, tiles = plan[:3]
    run(dy, x, weight if weight is not None else x, mean, rstd, shares, count, dx, dy.stride(0), x.stride(0),
        dx.stride(0), M - R, M, 1.0 / N, hot_tile, last_tile, tiles, target)  # fmt: skip


def reduce_launch(n: int, acc_size: int, max_p: int, compute_dw: bool, compute_db: bool,
                  order: dict) -> Launch:  # fmt: skip
    """The launch of the dw/db reduction of at most ``max_p`` partial rows (see :func:`reduce_tile`)."""
    block_p, block_n, warps = reduce_tile(n, acc_size, max_p, INTERPRETED)
    return Launch(_dwdb_reduce_kernel, (triton.cdiv(n, block_n),), BLOCK_P=block_p, BLOCK_N=block_n,
                  COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, num_warps=warps, **order)  # fmt: skip


def reduce_partials(dw_part, db_part, dw, db, p: int, n: int, max_p: int, order: dict | None = None) -> None:
    """dw (db) = the column sums of the first ``p`` rows of the (p, n) partials ``dw_part`` (``db_part``),
    cast to dw's (db's) dtype; a None partial buffer skips its sum. ``max_p`` bounds ``p`` for the
    configuration (it sets the tile, see :func:`reduce_tile`). ``order``: the launch's grid dependency
    control (``GDC``, ``launch_pdl``), none by default."""
    compute_dw, compute_db = dw_part is not None, db_part is not None
    if not compute_dw:  # the skipped sum's pointers: placeholders the kernel does not touch
        dw_part, dw = db_part, db
    if not compute_db:
        db_part, db = dw_part, dw
    run = reduce_launch(n, dw_part.element_size(), max_p, compute_dw, compute_db, order or {})
    run(dw_part, db_part, dw, db, p, n)


def few_launch(m: int, n: int, flags: dict, compute_dw: bool, compute_db: bool, sms: int,
               few: FewRowsConfig = FEW_ROWS) -> Launch:  # fmt: skip
    """The launch of ``_ln_bwd_few_kernel`` on ``m`` rows of ``n`` (``flags``: HAS_WEIGHT, IS_FP64): column
    blocks of 16 to ``few.max_col_n`` (wider while there are still about two blocks an SM), row tiles of
    whole rows up to FUSED_MAX_N, else rows in chunks; as many row programs as tiles, at most two an SM."""
    col_n = 16
    while col_n < few.max_col_n and triton.cdiv(n, 2 * col_n) >= sms:
        col_n *= 2
    col_n = min(col_n, triton.next_power_of_2(n))
    col_m = max(1, few.col_tile // col_n // (2 if flags["IS_FP64"] else 1))
    chunked = n > FUSED_MAX_N
    block_n = few.row_tile if chunked else triton.next_power_of_2(n)
    row_m = 1 if chunked else max(1, few.row_tile // block_n)
    warps = max(few.num_warps, min(16, row_m * block_n // 1024))
    cols = triton.cdiv(n, col_n) if compute_dw or compute_db else 0
    rows = min(triton.cdiv(m, row_m), 2 * sms)
    return Launch(_ln_bwd_few_kernel, (cols + rows,), COL_PROGRAMS=cols, COL_M=col_m, COL_N=col_n,
                  ROW_M=row_m, BLOCK_N=block_n, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
                  EVEN_N=n == block_n, POW2_N=is_pow2(n), CHUNKED=chunked, ONE_COL=n == 1, num_warps=warps,
                  **flags)  # fmt: skip


class BwdPlan(Plan):
    """The backward on (M, N) rows ``dy`` and ``x`` (row strides fixed), with or without weight, for the
    gradients asked and one configuration: dx (in ``dx_shape``), dw and db (in ``param_shape``) allocated,
    the scratch views laid out, the launches."""

    def __init__(self, dy, x, weight, compute_dw: bool, compute_db: bool, config: LaunchConfig | None,
                 dx_shape=None, param_shape=None, pdl: bool | None = None,
                 dx_like: bool = False, few: FewRowsConfig = FEW_ROWS):  # fmt: skip
        super().__init__(x.device, INTERPRETED)
        # dx as torch.empty_like(the x given to run): the caller's promise that that x is contiguous and of
        # dx's shape (cheaper to ask torch for)
        self.dx_like = dx_like
        M, N = x.shape
        self.m, self.n, self.device = M, N, x.device
        self.dx_shape = tuple(dx_shape) if dx_shape is not None else (M, N)
        self.param_shape = tuple(param_shape) if param_shape is not None else (N,)
        self.dtype = x.dtype
        self.param_dtype = weight.dtype if weight is not None else x.dtype
        self.compute_dw, self.compute_db = compute_dw, compute_db
        # dw and db as torch.empty_like(weight): a contiguous weight of normalized_shape (its own dtype)
        self.w_like = (weight is not None and weight.is_contiguous()
                       and tuple(weight.shape) == self.param_shape)  # fmt: skip
        self.path = "empty"
        self.launches: tuple = ()
        self.ready = False  # see run
        if M == 0:
            return
        acc = self.acc = stats_dtype(x.dtype)
        esize = x.element_size()
        cfg = config or default_config(N, x.dtype, "bwd", M, card_of(x))
        if cfg.smem_rows:  # a Gluon kernel, where it can run; else the Triton kernels in its place
            if cfg.slices > 1:  # and a launch that fits these rows (an entry of another N may not)
                unfit = gluon_bwd.groups_launch_unfit(N, esize, cfg.slices, cfg.num_warps, cfg.tma_stages,
                                                      cfg.lag)  # fmt: skip
                usable = gluon_bwd.groups_usable(x, dy, weight, INTERPRETED, cfg.slices) and not unfit
            else:
                usable = gluon_bwd.usable(x, dy, weight, INTERPRETED)
            if not usable:
                cfg = smem_rows_fallback(cfg, N, esize, M)
        grouped = cfg.smem_rows and cfg.slices > 1  # rows split between the programs of a group
        smem_rows = cfg.smem_rows and not grouped  # whole rows
        sms = device_parallelism(x)
        col_blocks = triton.cdiv(N, cfg.block_n)
        # the cooperative kernel's programs wait for each other: not under the interpreter, which runs one
        # program at a time, unless a row is one slab (then the split backward gives the same results)
        coop = cfg.coop and (col_blocks == 1 or not INTERPRETED)
        whole_rows = col_blocks == 1 and not coop and not grouped
        if grouped:  # programs_per_sm programs an SM, in groups of `slices`; partials a row a group (or pair)
            max_programs = max(1, max(1, cfg.programs_per_sm) * sms // cfg.slices)
            programs = min(M, max_programs)
        elif whole_rows:
            programs = backward_programs(cfg, M, esize, sms)
            if not few.takes(M, N * esize):  # fewer, where that lets the partials fit into dx after all
                programs = fitting_programs(programs, M, cfg.block_m, N * esize, N, acc.itemsize,
                                            compute_dw + compute_db)  # fmt: skip
            max_programs = max(1, cfg.programs_per_sm) * sms
        else:
            max_programs = math.ceil(cfg.programs_per_sm * sms / col_blocks)  # row groups
            programs = max(1, min(triton.cdiv(M, cfg.block_m), max_programs))
        paired = grouped and cfg.paired
        slots = self.slots = gluon_bwd.partial_slots(programs, paired)  # rows of partials
        max_slots = gluon_bwd.partial_slots(max_programs, paired)
        # the scratch: [dw partials | db partials | the split backward's c1 | c2, or the cooperative
        # kernel's ring of row-sum shares | counters, or the grouped kernel's pairs' arrivals and flags and
        # its row-sum shares | its ticket counter], each 128-byte aligned
        part = align(slots * N)
        at_db = self.at_db = part if compute_dw else 0
        at_c1 = self.at_c1 = at_db + part if compute_db else at_db
        pair_words = self.pair_words = align(2 * slots * cfg.slices) if paired else 0
        if grouped:  # (2, slots, slices) int32 if paired, the row sums' shares (M, 2, slices) int64; tickets
            extra = (pair_words + align(4 * cfg.slices * M), align(1))
        elif whole_rows:
            extra = (0, 0)
        elif coop:
            extra = (align(programs * 4 * col_blocks * cfg.block_m), align(programs + 1))
        else:
            extra = (align(M), align(M))
        at_c2 = self.at_c2 = at_c1 + extra[0]
        total = self.total = at_c2 + extra[1]
        R, start = scratch_rows(M, N * esize, total * acc.itemsize) if total else (0, 0)
        self.R, self.start = R, start
        has_w = weight is not None
        flags = dict(HAS_WEIGHT=has_w, IS_FP64=x.dtype == torch.float64)
        # each kernel after the first is a programmatic dependent launch where the GPU allows (``then``):
        # it starts while the kernel before it ends and waits for it inside (_wait_for_previous)
        gdc = gdc_usable(x) if pdl is None else pdl
        first = dict(GDC=gdc)
        then = dict(GDC=True, launch_pdl=True) if gdc else first
        self.strides = (dy.stride(0), x.stride(0), N)  # dx: contiguous rows
        if total and not R and few.takes(M, N * esize):  # scratch dx cannot hold: one launch, no scratch
            self.path = "few"
            self.main = few_launch(M, N, flags, compute_dw, compute_db, sms, few)
            self.launches = (self.main,)
            return
        self.rowsums = None  # the split backward's first launch
        self.finish = None
        if grouped:
            self.path = "grouped"
            self.programs, self.slices = programs, cfg.slices
            self.main = gluon_bwd.groups_launch(M, N, esize, has_w, programs, compute_dw, compute_db,
                                                cfg.slices, cfg.num_warps, cfg.tma_stages, cfg.lag, paired,
                                                gdc)  # fmt: skip
            self.paired = paired
        elif smem_rows:
            self.path = "smem_rows"
            self.main = gluon_bwd.rows_launch(M, N, esize, has_w, programs, compute_dw, compute_db,
                                              cfg.num_warps, cfg.tma_stages)  # fmt: skip
        elif whole_rows:
            self.path = "whole_rows"
            use_tma = cfg.tma_stages and tma_usable(x, dy)
            self.descs = {1: row_desc(dy, cfg), 2: row_desc(x, cfg)} if use_tma else None
            self.main = self._fused(cfg, programs, compute_dw, compute_db, first, self.descs, flags, N)
            self.main_tail = (0, M, M - R, N, 1.0 / N)
        elif coop:
            self.path = "coop"
            self.programs = programs
            self.main = Launch(
                _ln_bwd_coop_kernel, (col_blocks * programs,), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                SLABS=col_blocks, SLABS_P2=triton.next_power_of_2(col_blocks), COMPUTE_DW=compute_dw,
                COMPUTE_DB=compute_db, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps, **flags, **first,
            )  # fmt: skip
        else:
            self.path = "split"
            # the row sums' own launch: chunks of ROWSUMS_BLOCK_N, N a constant within the table's range
            # (its chunk loop unrolled, every chunk's loads out together)
            self.rowsums = Launch(
                _ln_bwd_rowsums_kernel, (M - R,), BLOCK_N=min(ROWSUMS_BLOCK_N, triton.next_power_of_2(N)),
                WRITE_DX=False, N_C=N if N <= FUSED_MAX_N else 0, num_warps=8, **flags, **first,
            )  # fmt: skip
            self.main = Launch(
                _ln_bwd_split_kernel, (col_blocks, programs), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, UNROLL=cfg.unroll, PREFETCH=cfg.prefetch,
                num_warps=cfg.num_warps, **flags, **then,
            )  # fmt: skip
        self.reduce = None
        if compute_dw or compute_db:
            self.reduce = reduce_launch(N, acc.itemsize, max_slots, compute_dw, compute_db, then)
        self.last = None
        if grouped and R:
            shares_at = start + (at_c1 + pair_words) * acc.itemsize
            fplan = finish_plan(M, N, esize, R, shares_at, cfg.slices)
            if fplan:  # the grouped kernel posted the R rows' sums: their dx from those, in parallel
                self.last, target = finish_launch(N, has_w, cfg.slices, programs * cfg.slices, fplan, then)
                self.finish = (M - R, M, 1.0 / N, *fplan[:3], target)
        if R and self.finish is None:
            # the last R rows' dx over the partials (read by now)
            if self.path == "whole_rows":  # one program per tile
                grid = triton.cdiv(R, cfg.block_m)
                self.last = self._fused(cfg, grid, False, False, then, self.descs, flags, N)
                self.last_tail = (M - R, M, M, N, 1.0 / N)
            else:
                # one program per row, about one per SM, walking its row twice: four chunks' loads go out
                # together (float32 N = 16384: 8.3 -> 6.7 us; bf16 unchanged at 7.6). After the Gluon
                # kernel too: that kernel again over the R rows measured 0.94x at bf16 4096x8192
                self.last = Launch(
                    _ln_bwd_rowsums_kernel, (R,), BLOCK_N=2048 if cfg.smem_rows else cfg.block_n,
                    WRITE_DX=True, UNROLL=4, num_warps=8, **flags, **then,
                )  # fmt: skip
                self.last_tail = (M - R, M, N)
        # the cooperative and grouped kernels' counters and flags, zeroed before their launch
        self.zero = Zeroing() if self.path in ("coop", "grouped") else None
        self.launches = tuple(
            launch for launch in (self.zero, self.main, self.rowsums, self.reduce, self.last)
            if launch is not None
        )  # fmt: skip

    @staticmethod
    def _fused(cfg, grid, compute_dw, compute_db, order, descs, flags, N):
        """The whole-row kernel's launch (rows row0..M-1, dx of those below dx_m: its arguments), reading
        dy and x through descriptors where ``descs`` (see :class:`.plan.Launch`)."""
        sums = dict(COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, num_warps=cfg.num_warps, **flags, **order)
        even = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_N=N == cfg.block_n, POW2_N=is_pow2(N),
                    ONE_COL=N == 1)  # fmt: skip
        if descs:
            return Launch(_ln_bwd_tma_kernel, (grid,), descs, STAGES=cfg.tma_stages, **even, **sums)
        return Launch(_ln_bwd_kernel, (grid,), UNROLL=cfg.unroll, PREFETCH=cfg.prefetch, **even, **sums)

    def run(self, dy, x, weight, mean, rstd):
        """``(dx, dw, db)`` from rows ``dy`` and ``x`` (this plan's layout); dw, db None where not asked.

        ``ready``: every launch goes straight to its compiled kernel (set after the first call that made
        them all through Triton's dispatch). Then the scratch memory's parts are passed as addresses
        instead of views, and ``mean`` and ``rstd`` may be addresses too; before, they must be tensors."""
        dev = self.device
        dx = torch.empty_like(x) if self.dx_like else torch.empty(self.dx_shape, dtype=self.dtype, device=dev)
        dw = self._param_grad(weight) if self.compute_dw else None
        db = self._param_grad(weight) if self.compute_db else None
        path = self.path
        if path == "empty":
            for t in (dw, db):
                if t is not None:
                    t.zero_()
            return dx, dw, db
        M, total, isz = self.m, self.total, self.acc.itemsize
        s_dy, s_x, s_dx = self.strides
        if path == "few":  # a skipped sum's pointer: a placeholder the kernel does not touch
            args = (dx, dy, x, weight if weight is not None else x, dx if dw is None else dw,
                    dx if db is None else db)  # fmt: skip
            if self.ready:  # addresses (see FwdPlan.run)
                args = tuple(t.data_ptr() for t in args)
            self.main(*args[:4], mean, rstd, *args[4:], s_dx, s_dy, s_x, M, self.n, 1.0 / self.n)
            self.ready = self.main.go is not None
            return dx, dw, db
        own = None  # the scratch's own buffer (few rows), kept alive until every launch is made
        if self.R:
            base = dx
        elif total:
            base = own = torch.empty(total, dtype=self.acc, device=dev)
        else:  # nothing to keep
            base = dx
        ready = self.ready
        if ready:  # addresses: the scratch's parts (start: bytes into dx where the last R rows hold it)
            ptr = base.data_ptr() + (self.start if self.R else 0)

            def at(i, dtype=None):
                return ptr + i * isz
        else:
            scratch = self._scratch(dx, own) if total else dx

            def at(i, dtype=None):
                part = scratch[i:]
                return part if dtype is None else part.view(dtype)

        dw_part = at(0) if self.compute_dw else dx
        db_part = at(self.at_db) if self.compute_db else dx
        w = weight if weight is not None else x
        at_c1, at_c2 = self.at_c1, self.at_c2
        if path == "whole_rows":
            descs = self.descs
            strides = (s_dx, s_dy, s_x) if descs is None else (s_dx,)
            rows = (dx, dy, x)
            if ready:  # addresses where the kernels take pointers (see FwdPlan.run); a descriptor's base
                rows = (dx.data_ptr(), dy, x) if descs else (dx.data_ptr(), dy.data_ptr(), x.data_ptr())
                w = w.data_ptr()
            self.main(*rows, w, mean, rstd, dw_part, db_part, *strides, *self.main_tail)
        elif path == "split":
            c1, c2 = at(at_c1), at(at_c2)  # of the rows below M - R
            self.rowsums(dy, x, w, mean, rstd, c1, c2, dx, s_dy, s_x, s_dx, 0, M, self.n)
            self.main(dx, dy, x, w, mean, rstd, c1, c2, dw_part, db_part, s_dx, s_dy, s_x, M, M - self.R,
                      self.n)  # fmt: skip
        else:
            zero = self._scratch(dx, own) if ready else scratch  # a tensor: parts zeroed before the launch
            if path == "coop":
                self.zero(zero[at_c2 : at_c2 + self.programs + 1])
                count = at(at_c2, torch.int32)
                self.main(dx, dy, x, w, mean, rstd, at(at_c1), count, dw_part, db_part, s_dx, s_dy, s_x, M,
                          M - self.R, self.n)  # fmt: skip
            else:  # the Gluon kernels: on (M, N) views
                N = self.n
                dx2, dy2, x2 = dx.view(M, N), dy.reshape(M, N), x.reshape(M, N)
                if path == "grouped":
                    self.zero(zero[at_c1 : at_c2 + 1])  # pairs, shares and tickets: one memset
                    pairs = at(at_c1, torch.int32)
                    shares = at(at_c1 + self.pair_words, torch.int64)
                    count = at(at_c2, torch.int32)
                    self.main(*gluon_bwd.groups_args(dx2, dy2, x2, weight, mean, rstd, shares, count, pairs,
                                                     dw_part, db_part, M - self.R, self.slices,
                                                     self.paired))  # fmt: skip
                else:
                    args = gluon_bwd.rows_args(dx2, dy2, x2, weight, mean, rstd, dw_part, db_part, M - self.R)
                    self.main(*args)
        if self.reduce is not None:  # a skipped sum's pointers: placeholders the kernel does not touch
            cdw, cdb = self.compute_dw, self.compute_db
            sums = (dw if cdw else db, db if cdb else dw)
            if ready:
                sums = (sums[0].data_ptr(), sums[1].data_ptr())
            self.reduce(dw_part if cdw else db_part, db_part if cdb else dw_part, *sums, self.slots,
                        self.n)  # fmt: skip
        last = self.last
        if last is not None:
            if self.finish is not None:  # from the row sums the grouped kernel posted
                last(dy, x, w, mean, rstd, shares, count, dx, s_dy, s_x, s_dx, *self.finish)
            elif path == "whole_rows":
                last(*rows, w, mean, rstd, dw_part, db_part, *strides, *self.last_tail)
            else:
                last(dy, x, w, mean, rstd, dx, dx, dx, s_dy, s_x, s_dx, *self.last_tail)
        del own
        if not ready:
            self.ready = all(launch.go is not None for launch in self.launches)
        return dx, dw, db

    def _param_grad(self, weight):
        """A new tensor for dw or db: like the weight where that is one (cheaper to ask torch for)."""
        if self.w_like:
            return torch.empty_like(weight)
        return torch.empty(self.param_shape, dtype=self.param_dtype, device=self.device)

    def _scratch(self, dx, own):
        """The scratch memory as a tensor of the accumulator dtype (the last R rows' bytes of dx, or its own
        buffer)."""
        if own is not None:
            return own
        return dx.view(torch.uint8).view(-1)[self.start : self.start + self.total * self.acc.itemsize].view(
            self.acc
        )


BWD_PLANS = PlanCache(BwdPlan)


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight, mean, rstd, compute_dw: bool, compute_db: bool,
                   config: LaunchConfig | None = None, pdl: bool | None = None,
                   few: FewRowsConfig = FEW_ROWS):  # fmt: skip
    """Backward on 2-D ``dy`` and ``x`` (unit column stride). Returns ``(dx, dw, db)``; dw/db may be None.
    ``config`` overrides the tables (for tuning and tests); ``pdl`` False launches the kernels one after
    another without programmatic dependent launch (for tests; the default: where the GPU allows); ``few``:
    the backward of few rows (``FewRowsConfig(max_rows=0)``: never; for tests and measurements)."""
    weight = None if weight is None else weight.contiguous()
    stats = (mean.data_ptr() % 16 == 0, rstd.data_ptr() % 16 == 0)
    key = (tensor_key(dy), tensor_key(x), tensor_key(weight), stats, compute_dw, compute_db, config, pdl, few)
    plan = BWD_PLANS.get(key, dy, x, weight, compute_dw, compute_db, config, None, None, pdl, False, few)
    return plan(dy, x, weight, mean, rstd)
