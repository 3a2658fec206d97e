"""The jobs of ``crossfuse check``: each (implementation, device, dtype) over its op's cases, one result
per job (``(op, impl, side, device, dtype)``, status, largest errors, note), and the table's rows."""

from __future__ import annotations

from . import check
from .harness.progress import Progress
from .harness.schema import dtype_str
from .harness.suite import matches

RANK = {"error": 3, "fail": 2, "pass": 1, "skip": 0}


def run_jobs(jobs: list, check_cases: dict, skips: list[str], seed: int | None, results: list) -> None:
    """Check each (implementation, device, dtype) over ``check_cases[op]`` (``(shape, options)`` pairs),
    appending one result to ``results`` as each ends (an interrupt leaves those done in the list)."""
    with Progress(sum(len(check_cases.get(i.op, ())) or 1 for i, _, _ in jobs), "check") as bar:
        for impl, dev, dt in jobs:
            cases = check_cases.get(impl.op, [])
            base = [impl.op, impl.name, impl.side, dev, dtype_str(dt)]
            if any(matches(impl, p) for p in skips):
                results.append((base, "skip", None, None, "excluded by --skip"))
                bar.update(impl.key)
                continue
            reason = impl.unavailable_reason(dev, dt)  # asked once per implementation, device, dtype
            if reason is None and not impl.same_function:
                reason = "speed-only peer: computes a different function (no reference to compare with)"
            if reason or not cases:
                results.append((base, "skip", None, None, reason or "no check cases for this op"))
                for _ in cases or [None]:
                    bar.update(impl.key)
                continue
            worst, fwd, grad, notes = "skip", None, None, []
            for shape, options in cases:
                r = check.run_case(impl, shape, dt, dev, options, seed=seed)
                bar.update(f"{impl.key} {dtype_str(dt)} {dev}")
                worst = max(worst, r.status, key=RANK.__getitem__)
                if r.fwd_err is not None:
                    fwd = r.fwd_err if fwd is None else max(fwd, r.fwd_err)
                if r.max_grad_err is not None:
                    grad = r.max_grad_err if grad is None else max(grad, r.max_grad_err)
                if r.status == "fail":
                    notes.append(r.summary())
                elif r.status != "pass":
                    notes.append(
                        f"{'x'.join(map(str, shape))} {options or ''} seed={r.seed}: {r.status} {r.reason}"
                    )
                elif r.slack_rows:  # a pass that gave gradient rows slack: say which
                    rows = ", ".join(f"{n} d{k}" for k, n in r.slack_rows.items())
                    case = f"{'x'.join(map(str, shape))} {options or ''} seed={r.seed}"
                    notes.append(f"{case}: {rows} rows given slack (at relu's kink at this precision)")
            results.append((base, worst, fwd, grad, "; ".join(notes)))


def collapse_skips(results: list) -> list:
    """One row ``dtype *`` for an (op, impl, side, device) whose dtypes were all skipped for one reason."""
    groups: dict = {}
    for r in results:
        groups.setdefault(tuple(r[0][:4]), []).append(r)
    out = []
    for key, rs in groups.items():
        if len(rs) > 1 and all(r[1] == "skip" for r in rs) and len({r[4] for r in rs}) == 1:
            out.append(([*key, "*"], "skip", None, None, rs[0][4]))
        else:
            out.extend(rs)
    return out
