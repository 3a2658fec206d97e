# Plain Float64 formulas, written out here, that the package's variants are compared against
# (included by runtests.jl and by cuda/runtests.jl).

# The largest elementwise difference, computed on the host (works for JLArray and CuArray too).
maxerr(a, b) = maximum(abs, Array(a) .- Array(b))

# Number of elements each slice reduces over.
count_over(x, dims) = length(x) ÷ length(sum(x; dims))

# op `normalise`: (x - μ) / sqrt(σ² + eps), σ² the biased variance, over `dims`.
function ref_normalise(x; dims = 1, eps)
    x64 = Float64.(Array(x))
    n = count_over(x64, dims)
    μ = sum(x64; dims) ./ n
    σ² = sum(abs2.(x64 .- μ); dims) ./ n
    return (x64 .- μ) ./ sqrt.(σ² .+ eps)
end

# op `layer_norm`: torch's affine layer norm; γ, β (or nothing) have the normalised dims' size.
function ref_layernorm(x, γ, β; dims = 1, eps = 1.0e-5)
    n = ref_normalise(x; dims, eps)
    shape = ntuple(d -> d in dims ? size(x, d) : 1, ndims(x))
    scaled = γ === nothing ? n : n .* reshape(Float64.(γ), shape)
    return β === nothing ? scaled : scaled .+ reshape(Float64.(β), shape)
end

# op `layer_norm_maxstd`: α (x - μ) / max(σ, ϵ) + β over dims = 1, two-pass statistics.
function ref_maxstd(ϵ, α, β, x)
    x64 = Float64.(Array(x))
    n = size(x64, 1)
    μ = sum(x64; dims = 1) ./ n
    σ = sqrt.(sum(abs2.(x64 .- μ); dims = 1) ./ n)
    a = α === nothing ? 1.0 : Float64.(α)
    b = β === nothing ? 0.0 : Float64.(β)
    return a .* (x64 .- μ) ./ max.(σ, ϵ) .+ b
end
