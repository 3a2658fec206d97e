"""What is measured: benchmark suites as data (no code). Read by ``crossfuse bench <suite>`` and
``bench/gpu_session.py`` through :func:`crossfuse.harness.suite.load_suites`; ships with the package, so
an installed crossfuse runs them from any directory. ``crossfuse bench --suites FILE`` (or
``CROSSFUSE_SUITES=FILE``) reads a file of the same form instead.

A suite is a list of groups; a group is ops × shapes × dtypes × options × modes, and the implementations
are every registry entry of each op (``crossfuse.registry.implementations(op)``), optionally filtered by
name (``impls``: fnmatch patterns). ``quick_shapes`` replace ``shapes`` under ``--quick`` (tiny shapes
for the CPU). ``exclude`` skips implementations (fnmatch on the name) on a device with a stated reason
(written into the row's ``note``); ``quick_only`` limits an exclusion to ``--quick``. ``copy_ceiling``
adds one row ``op="copy"``: a device-to-device copy of ``numel`` elements (bytes read + written), the
bandwidth ceiling that reports show GB/s against.

Shapes are the op's ``shape_names`` (``registry.OPS[op].shape_names``): (M, N) for the normalisations,
(B, H, L, D) for attention.
"""

# torch.compile's first compile of a graph takes ~30 s on a small CPU: fine on the GPU machine, too slow
# for the quick suites (and for the CPU memory suite, which is about eager autograd's memory).
COMPILE_ON_CPU = {
    "impl": "*compile*",
    "device": "cpu",
    "reason": "torch.compile excluded on the CPU: a first compile takes ~30 s per shape and dtype",
}

_LN_N = (1024, 2048, 4096, 8192, 16384)

SUITES = {
    "layer_norm": {
        "description": "Layer norm forward/backward bandwidth: M=4096 over N, two large shapes; bf16, fp32",
        "copy_ceiling": {
            "dtype": "bfloat16",
            "numel": {"cuda": 1 << 29, "cpu": 1 << 26},
            "quick_numel": 1 << 22,
        },
        "groups": [
            {
                "ops": ["layer_norm"],
                "shapes": [*[(4096, n) for n in _LN_N], (65536, 1024), (32768, 4096)],
                "quick_shapes": [(64, 256), (64, 1024)],
                "dtypes": ["bfloat16", "float32"],
                "modes": ["fwd", "bwd", "fwd+bwd"],
            },
            {
                "ops": ["normalise", "layer_norm_maxstd"],
                "shapes": [(4096, 4096), (32768, 4096)],
                "quick_shapes": [(64, 1024)],
                "dtypes": ["bfloat16", "float32"],
                "modes": ["fwd", "bwd", "fwd+bwd"],
            },
        ],
        "exclude": [{**COMPILE_ON_CPU, "quick_only": True}],
    },
    "attention": {
        "description": "ReLU attention, 16k tokens a batch (B = 16384/L), bf16; H=32 for D=64, 16 for D=128",
        "groups": [
            {
                "ops": ["relu_attention"],
                "shapes": [
                    *[(16384 // l, 32, l, 64) for l in (1024, 4096, 16384)],
                    *[(16384 // l, 16, l, 128) for l in (1024, 4096, 16384)],
                ],
                "quick_shapes": [(2, 2, 64, 32), (1, 2, 128, 32)],
                "dtypes": ["bfloat16"],
                "options": [{"causal": False}, {"causal": True}],
                "modes": ["fwd", "fwd+bwd"],
            },
        ],
        "exclude": [{**COMPILE_ON_CPU, "quick_only": True}],
    },
    "memory": {
        "description": "Bytes allocated by the forward and by the gradient of each normalisation variant "
        "(the seed's point: naive autograd against memory-saving rules); float32",
        "groups": [
            {
                "ops": ["normalise", "layer_norm", "layer_norm_maxstd"],
                # the seed's 1000x10000 Julia array (column-major) is M=10000 rows of N=1000 in torch
                "shapes": [(10000, 1000), (4096, 8192)],
                "quick_shapes": [(100, 1000)],
                "dtypes": ["float32"],
                "modes": ["fwd", "bwd", "fwd+bwd"],
            },
        ],
        "exclude": [
            COMPILE_ON_CPU,
            {
                "impl": "fused",
                "device": "cpu",
                "quick_only": True,
                "reason": "Triton's interpreter on the CPU: its memory says nothing of the kernels' and its "
                "accuracy is `crossfuse check`'s (a quick memory run stays fast)",
            },
        ],
    },
}
