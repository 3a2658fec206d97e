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

# The space users hit, not the tuned shapes (the grid suites): row lengths from 64 to 65536, the model
# widths that are not powers of two among them; row counts from one row to a million, as far as 2^28
# elements (1 GiB of float32 a tensor, a backward's five of them fit an 80 GB card).
GRID_N = (64, 128, 256, 512, 768, 1000, 1024, 2048, 2560, 4096, 5000, 8192, 12288, 16384, 32768, 65536)
GRID_M = (1, 7, 128, 1000, 4096, 16384, 32768, 131072, 1048576)
GRID_MAX_ELEMENTS = 1 << 28
# attention: every head dim, sequence lengths that are and are not multiples of 64, few heads and small
# batches as well as the anchors' 16k tokens
GRID_ATTN = [
    *[(1, 4, length, d) for d in (16, 32, 64, 128, 256) for length in (77, 1000, 2048)],
    *[(8, 12, length, 64) for length in (197, 2000, 2048)],
    *[(16, 16, 512, d) for d in (64, 128, 256)],
    (4, 16, 1024, 64),
    (2, 8, 4096, 128),
]

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
    "layer_norm_grid": {
        "description": "Layer norm over the space users hit: N 64..65536 (non-powers of two among them) × "
        "M 1..1048576 up to 2^28 elements; bf16, fp16, fp32",
        "copy_ceiling": {
            "dtype": "bfloat16",
            "numel": {"cuda": 1 << 28, "cpu": 1 << 22},
            "quick_numel": 1 << 20,
        },
        "groups": [
            {
                "ops": ["layer_norm"],
                "shapes": [(m, n) for n in GRID_N for m in GRID_M if m * n <= GRID_MAX_ELEMENTS],
                "quick_shapes": [(1, 64), (7, 1000), (64, 768)],
                "dtypes": ["bfloat16", "float16", "float32"],
                "modes": ["fwd", "bwd"],
            },
        ],
        "exclude": [{**COMPILE_ON_CPU, "quick_only": True}],
    },
    "attention_grid": {
        "description": "ReLU attention over head dims 16..256, lengths not multiples of 64, few heads and "
        "small batches, causal or not; bf16, fp16",
        "groups": [
            {
                "ops": ["relu_attention"],
                "shapes": GRID_ATTN,
                "quick_shapes": [(1, 2, 77, 16), (1, 1, 65, 64)],
                "dtypes": ["bfloat16", "float16"],
                "options": [{"causal": False}, {"causal": True}],
                "modes": ["fwd", "fwd+bwd"],
            },
        ],
        "exclude": [{**COMPILE_ON_CPU, "quick_only": True}],
    },
    "attention_fp32": {
        "description": "ReLU attention in float32 (tf32 dots) against the seed notebook's algorithm "
        "(row_block): its shapes (B=4, H=16, D=64, L 1024..8192), other head dims, a length not a multiple "
        "of 64, causal or not",
        "groups": [
            {
                "ops": ["relu_attention"],
                "shapes": [
                    *[(4, 16, length, 64) for length in (1024, 2048, 4096, 8192)],
                    *[(1, 4, 1000, d) for d in (16, 32, 128, 256)],
                    (8, 12, 197, 64),
                    (2, 8, 4096, 128),
                ],
                "quick_shapes": [(1, 2, 77, 16), (1, 1, 65, 64)],
                "dtypes": ["float32"],
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
