# CrossFuse's CUDA tests, in their own environment (this folder's Project.toml):
#     julia --project=julia/test/cuda julia/test/cuda/runtests.jl
# (`make julia-test-cuda`). They need an NVIDIA GPU that CUDA.jl can use.

using CrossFuse
using CUDA: CUDA
using ChainRulesCore: rrule
using Statistics: mean, var
using Test: @test, @testset
using Zygote: Zygote

include(joinpath(@__DIR__, "..", "references.jl"))

@testset "CrossFuse on CUDA" begin
    include("cuda.jl")
end
