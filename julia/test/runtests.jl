# The CrossFuse test suite: `] test CrossFuse` (or `julia --project=julia -e 'using Pkg; Pkg.test()'`).
# The files mirror src/: stats.jl, normalise.jl, layernorm.jl, layer_norm.jl, measure.jl; plus
# gpu_paths.jl (the AbstractGPUArray methods, run on JLArrays without a GPU) and cuda.jl (run only
# where CUDA.jl loads and `CUDA.functional()`; skipped visibly otherwise).

using CrossFuse
using ChainRulesCore: ChainRulesCore, NoTangent, rrule
using ChainRulesTestUtils: test_rrule, ⊢
using FiniteDifferences: FiniteDifferences, central_fdm
using JLArrays: JLArray
using Random: Random
using Statistics: mean, var
using Test: @test, @test_skip, @test_throws, @testset
using Zygote: Zygote

# Fresh random inputs on every run; the seed is printed so that a failure can be replayed.
const TEST_SEED = rand(Random.RandomDevice(), UInt32)
@info "CrossFuse tests: Random.seed!($(TEST_SEED))"
Random.seed!(TEST_SEED)

# CUDA is detected once, here, at top level (a `using` cannot sit inside a testset).
const HAVE_CUDA_PACKAGE = Base.find_package("CUDA") !== nothing
if HAVE_CUDA_PACKAGE
    using CUDA: CUDA
end

# The abstract GPU array type that the GPU methods dispatch on (GPUArraysCore's, via CrossFuse).
const GPUArray = CrossFuse.AbstractGPUArray

include("references.jl")

@testset "CrossFuse" begin
    include("stats.jl")
    include("normalise.jl")
    include("layernorm.jl")
    include("layer_norm.jl")
    include("gpu_paths.jl")
    include("measure.jl")
    include("cuda.jl")
end
