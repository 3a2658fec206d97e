# The CrossFuse test suite: `] test CrossFuse` (or `julia --project=julia -e 'using Pkg; Pkg.test()'`,
# which `make julia-test` runs). The files mirror src/: stats.jl, normalise.jl, layernorm.jl,
# layer_norm.jl, measure.jl; plus gpu_paths.jl (the AbstractGPUArray methods, run on JLArrays
# without a GPU). CUDA.jl is no test dependency, so that `Pkg.test()` never resolves or
# precompiles it: the CUDA tests have their own environment, test/cuda (`make julia-test-cuda`).

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

# The abstract GPU array type that the GPU methods dispatch on (GPUArraysCore's, via CrossFuse).
const GPUArray = CrossFuse.AbstractGPUArray

include("references.jl")

# The gradient of `loss` at `args...` by finite differences, one array per argument.
fd_gradient(loss, args...) = FiniteDifferences.grad(central_fdm(5, 1), loss, args...)

@testset "CrossFuse" begin
    include("stats.jl")
    include("normalise.jl")
    include("layernorm.jl")
    include("layer_norm.jl")
    include("gpu_paths.jl")
    include("measure.jl")
end

@info "CUDA tests: not part of Pkg.test() (CUDA.jl is no test dependency); on a GPU machine, " *
    "`make julia-test-cuda` runs test/cuda/runtests.jl in its own environment"
