"""Bad inputs, table-driven, for every public function of ``crossfuse.reference``: each checks its
arguments as the ops do (a TypeError/ValueError naming the argument), but for the kernels' own limits."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from crossfuse import reference as ref
from test_bad_inputs import Case, meta, t

_A = (1, 2, 4, 8)  # a reference takes any head dim

REFERENCE = [
    Case(
        "reference.relu_attention_ref",
        "causal Lq != Lk",
        lambda: ref.relu_attention_ref(t(*_A), t(1, 2, 5, 8), t(1, 2, 5, 8), causal=True),
        ValueError,
        "Lq=4, Lk=5",
    ),
    Case(
        "reference.relu_attention_ref",
        "q int",
        lambda: ref.relu_attention_ref(torch.ones(_A, dtype=torch.int32), t(*_A), t(*_A)),
        TypeError,
        "q has dtype int32",
    ),
    Case(
        "reference.relu_attention_ref",
        "dtypes differ",
        lambda: ref.relu_attention_ref(t(*_A), t(*_A, dtype=torch.float64), t(*_A)),
        TypeError,
        "share one dtype",
    ),
    Case(
        "reference.relu_attention_ref",
        "q 3-D",
        lambda: ref.relu_attention_ref(t(2, 4, 8), t(2, 4, 8), t(2, 4, 8)),
        ValueError,
        "4-D",
    ),
    Case(
        "reference.relu_attention_ref",
        "heads differ",
        lambda: ref.relu_attention_ref(t(*_A), t(1, 3, 4, 8), t(1, 3, 4, 8)),
        ValueError,
        "heads",
    ),
    Case(
        "reference.relu_attention_ref",
        "v shape",
        lambda: ref.relu_attention_ref(t(*_A), t(*_A), t(1, 2, 4, 9)),
        ValueError,
        "v's shape",
    ),
    Case(
        "reference.relu_attention_ref",
        "scale 0",
        lambda: ref.relu_attention_ref(t(*_A), t(*_A), t(*_A), scale=0),
        ValueError,
        "scale",
    ),
    Case(
        "reference.relu_attention_ref",
        "relu_scale NaN",
        lambda: ref.relu_attention_ref(t(*_A), t(*_A), t(*_A), relu_scale=math.nan),
        ValueError,
        "relu_scale",
    ),
    Case(
        "reference.relu_attention_ref",
        "causal an int",
        lambda: ref.relu_attention_ref(t(*_A), t(*_A), t(*_A), causal=1),
        TypeError,
        "causal must be a bool",
    ),
    Case(
        "reference.relu_attention_ref",
        "k on meta",
        lambda: ref.relu_attention_ref(t(*_A), meta(*_A), meta(*_A)),
        ValueError,
        "k is on meta",
    ),
    Case(
        "reference.relu_attention_naive",
        "causal Lq != Lk",
        lambda: ref.relu_attention_naive(t(*_A), t(1, 2, 5, 8), t(1, 2, 5, 8), causal=True),
        ValueError,
        "Lq=4",
    ),
    Case(
        "reference.relu_attention_naive",
        "q a list",
        lambda: ref.relu_attention_naive([1.0], t(*_A), t(*_A)),
        TypeError,
        "q must be a torch.Tensor",
    ),
    Case(
        "reference.normalise_ref",
        "x int",
        lambda: ref.normalise_ref(torch.ones(2, 4, dtype=torch.int64)),
        TypeError,
        "x has dtype int64",
    ),
    Case(
        "reference.normalise_ref",
        "x 0-D",
        lambda: ref.normalise_ref(torch.tensor(1.0)),
        ValueError,
        "at least one",
    ),
    Case("reference.normalise_ref", "row of 0", lambda: ref.normalise_ref(t(2, 0)), ValueError, "last dim"),
    Case(
        "reference.normalise_ref", "eps negative", lambda: ref.normalise_ref(t(2, 4), -1.0), ValueError, "eps"
    ),
    Case(
        "reference.layer_norm_ref",
        "weight shape",
        lambda: ref.layer_norm_ref(t(2, 4), t(5)),
        ValueError,
        r"weight has shape \[5\]; expected \[4\]",
    ),
    Case(
        "reference.layer_norm_ref",
        "bias int",
        lambda: ref.layer_norm_ref(t(2, 4), None, torch.ones(4, dtype=torch.int64)),
        TypeError,
        "bias has dtype int64",
    ),
    Case(
        "reference.layer_norm_ref",
        "weight on meta",
        lambda: ref.layer_norm_ref(t(2, 4), meta(4)),
        ValueError,
        "weight is on meta",
    ),
    Case(
        "reference.layer_norm_ref",
        "eps a string",
        lambda: ref.layer_norm_ref(t(2, 4), eps="small"),
        TypeError,
        "eps must be a number",
    ),
    Case(
        "reference.layer_norm_maxstd_ref",
        "alpha shape",
        lambda: ref.layer_norm_maxstd_ref(t(2, 4), t(2, 4)),
        ValueError,
        "alpha has shape",
    ),
    Case(
        "reference.layer_norm_maxstd_ref",
        "eps inf",
        lambda: ref.layer_norm_maxstd_ref(t(2, 4), eps=math.inf),
        ValueError,
        "eps",
    ),
    Case(
        "reference.normal_now",
        "x a list",
        lambda: ref.normal_now([1.0, 2.0]),
        TypeError,
        "x must be a torch.Tensor",
    ),
    Case("reference.normal_new", "eps NaN", lambda: ref.normal_new(t(2, 4), math.nan), ValueError, "eps"),
    Case(
        "reference.normal_newer",
        "x sparse",
        lambda: ref.normal_newer(t(2, 4).to_sparse()),
        TypeError,
        "dense",
    ),
    Case(
        "reference.layernorm",
        "weight shape",
        lambda: ref.layernorm(t(2, 4), t(3)),
        ValueError,
        "weight has shape",
    ),
    Case(
        "reference.layer_norm",
        "beta on meta",
        lambda: ref.layer_norm(t(2, 4), None, meta(4)),
        ValueError,
        "beta is on meta",
    ),
    Case(
        "reference.tf32_truncate",
        "float16",
        lambda: ref.tf32_truncate(t(4, dtype=torch.float16)),
        TypeError,
        "t has dtype float16",
    ),
    Case("reference.kink_rows", "q 1-D", lambda: ref.kink_rows(t(8), t(8)), ValueError, "at least 2 dims"),
    Case(
        "reference.kink_rows",
        "head dims differ",
        lambda: ref.kink_rows(t(4, 8), t(4, 16)),
        ValueError,
        "head dim",
    ),
    Case(
        "reference.kink_slack",
        "v rows",
        lambda: ref.kink_slack(t(4, 8), t(4, 8), t(5, 8), t(4, 8)),
        ValueError,
        "v's shape",
    ),
    Case(
        "reference.kink_slack",
        "causal a string",
        lambda: ref.kink_slack(t(4, 8), t(4, 8), t(4, 8), t(4, 8), "no"),
        TypeError,
        "causal must be a bool",
    ),
]


@pytest.mark.parametrize("case", REFERENCE, ids=[f"{c.entry}: {c.name}" for c in REFERENCE])
def test_bad_reference_input_raises_a_clear_error(case: Case):
    with pytest.raises(case.exc, match=case.match):
        case.call()


def test_every_reference_function_has_cases(capsys):
    counts = Counter(c.entry for c in REFERENCE)
    with capsys.disabled():
        print("\n" + "\n".join(f"{n:4d}  {entry}" for entry, n in sorted(counts.items())))
    missing = {f"reference.{n}" for n in ref.__all__} - set(counts)
    assert not missing, missing
