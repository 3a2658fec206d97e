"""
    CrossFuse

Normalisation and layer-norm variants with hand-written ChainRulesCore rules, for plain and GPU
arrays, plus the helpers that measure them for the crossfuse benchmark.

Three ops, named by what they compute (the names are shared with the Python side):

| op                  | formula, normalised over `dims`                | implementations                          |
|:------------------- |:---------------------------------------------- |:---------------------------------------- |
| `normalise`         | `(x - μ) / sqrt(σ² + ε)`                       | [`normal_now`], [`normal_new`], [`normal_newer`] |
| `layer_norm`        | `(x - μ) / sqrt(σ² + ε) * γ + β`, `ε = 1e-5`   | [`layernorm`]                            |
| `layer_norm_maxstd` | `α * (x - μ) / max(σ, ϵ) + β`, `ϵ = 1e-5`      | [`layer_norm`]                           |

`μ` is the mean and `σ²` the biased variance (divided by the count, not the count minus one).
Generic code runs on any `AbstractArray`; methods for `AbstractGPUArray` (GPUArraysCore) take the
GPU-friendly path; CUDA-specific code (timing and allocation counters) lives in the package
extension `CrossFuseCUDAExt`, loaded with CUDA.jl.
"""
module CrossFuse

using ChainRulesCore:
    ChainRulesCore,
    AbstractZero,
    NoTangent,
    ProjectTo,
    @non_differentiable,
    ZeroTangent,
    @thunk,
    unthunk
using Dates: Dates
using GPUArraysCore: AbstractGPUArray
using Random: Random
using Statistics: mean, quantile, var

export normal_now, normal_new, normal_newer, mean_var
export layernorm, layer_norm
export measure_forward, measure_gradient, write_csv

include("stats.jl")
include("normalise.jl")
include("layernorm.jl")
include("layer_norm.jl")
include("measure.jl")

end # module CrossFuse
