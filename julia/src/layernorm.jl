#####
##### API: the op `layer_norm`, affine, torch's convention, NNlib-style
#####

"""
    layernorm(x, scale=nothing, bias=nothing; dims=1, eps=1e-5)

Affine layer normalisation over `dims` (op `layer_norm`, the convention of
`torch.nn.functional.layer_norm`):

    μ  = mean(x; dims)
    σ² = mean(abs2, x .- μ; dims)              # biased variance
    y  = (x .- μ) ./ sqrt.(σ² .+ eps) .* γ .+ β

`eps` is added to the variance, inside the square root; the default is `1e-5`. The statistics,
`eps` and the arithmetic are in `float(eltype(x))`, or in `Float32` for `Float16` input (whose
sums overflow past 65504), and `y` has `eltype(x)`. `γ` and `β` are `scale` and `bias`
reshaped to the size of the normalised dimensions (size `size(x, d)` along each `d` in `dims`, 1
elsewhere), as NNlib does: for the default `dims = 1`, vectors of length `size(x, 1)`. Either may
be `nothing`, independently of the other, meaning `γ = 1` or `β = 0`.

No custom rule: Zygote differentiates it (for `x`, `scale` and `bias`) through the rules for
`mean`, `var`, `reshape`, broadcasting and the widening helpers (`widen_stats`, `narrow_like`).
"""
function layernorm(
    x::AbstractArray,
    scale::Union{Nothing, AbstractArray} = nothing,
    bias::Union{Nothing, AbstractArray} = nothing;
    dims = 1,
    eps::Real = _layernorm_default_eps(x),
)
    xw = widen_stats(x) # one element type inside the broadcasts Zygote differentiates
    μ, σ² = _moments(xw, dims)
    n = _normalise_div(xw, μ, σ², _eps_like(x, eps))
    shape = _affine_shape(x, dims)
    γ = _reshape_affine(widen_stats(scale), shape, :scale)
    β = _reshape_affine(widen_stats(bias), shape, :bias)
    return narrow_like(x, _scale_shift(n, γ, β))
end

#####
##### Implementation
#####

_layernorm_default_eps(x::AbstractArray) = convert(_stat_type(float(eltype(x))), 1.0e-5)

@non_differentiable _layernorm_default_eps(::Any)

# The size of the normalised dimensions: size(x, d) for d in dims, 1 elsewhere.
_affine_shape(x::AbstractArray, ::Colon) = size(x)
_affine_shape(x::AbstractArray, dims) = ntuple(d -> d in dims ? size(x, d) : 1, ndims(x))

@non_differentiable _affine_shape(::Any, ::Any)

_reshape_affine(::Nothing, shape, name) = nothing
function _reshape_affine(p::AbstractArray, shape, name)
    if length(p) != prod(shape)
        throw(DimensionMismatch(
            "layernorm: `$name` has $(length(p)) elements, but the normalised " *
                "dimensions have size $shape ($(prod(shape)) elements)",
        ))
    end
    return reshape(p, shape)
end

_scale_shift(n, ::Nothing, ::Nothing) = n
_scale_shift(n, γ, ::Nothing) = n .* γ
_scale_shift(n, ::Nothing, β) = n .+ β
_scale_shift(n, γ, β) = n .* γ .+ β
