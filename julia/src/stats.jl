#####
##### API: mean and variance over `dims`, in one call
#####

"""
    mean_var(A; dims, corrected=false) -> (; mean, var)

The mean and the variance of `A` over `dims`, as a `NamedTuple`:

    mean = sum(A; dims) / N
    var  = sum(abs2, A .- mean; dims) / (N - corrected)      # N = sum_length(A, dims)

Both have the reduced shape (size 1 along `dims`, like `mean(A; dims)`), or are scalars when
`dims = :`. `corrected = false` (the default) gives the biased variance that normalisation layers
use.

Both are in [`_stat_type`](@ref)`(eltype(A))`: `Float32` for `Float16` input, whose sums in `Float16`
overflow past 65504 and round at every step (`Statistics.mean` and `var` reduce in the element
type), and `eltype(A)` otherwise.

Methods:
- any `AbstractArray`: `Statistics.mean`, then `Statistics.var` with that mean (two passes), on
  `A` widened by [`widen_stats`](@ref) (a copy for `Float16`, `A` itself otherwise);
- `AbstractGPUArray{Float32}`: one pass, a single `mapreduce` whose elements are
  `(mean, sum of squared deviations, count)` triples combined with Chan et al.'s pairwise update
  (Welford's algorithm in parallel form). A GPU reduction uses its `init` as the neutral element
  of every thread and block, so `init` is the empty triple `(0, 0, 0)` and the combine step
  returns it unchanged when both counts are zero. The result is split into the mean and variance
  arrays by two broadcasts, which stay on the device.

Rule: a `ChainRulesCore.rrule` for either method, with
`∂A = Δmean / N + Δvar * 2 (A - mean) / (N - corrected)`; the pullback saves `A` and `mean`.
"""
function mean_var(A::AbstractArray; dims, corrected::Bool = false)
    Aw = widen_stats(A)
    μ = mean(Aw; dims)
    σ² = var(Aw; dims, corrected, mean = μ)
    return (; mean = μ, var = σ²)
end

function mean_var(A::AbstractGPUArray{Float32}; dims, corrected::Bool = false)
    λ = inv(Float32(sum_length(A, dims) - corrected))
    R = mapreduce(_welford_leaf, _chan_combine, A; dims, init = _WELFORD_EMPTY)
    return _split_welford(R, λ)
end

"""
    sum_length(x, dims)

How many elements of `x` one reduction over `dims` combines: `size(x, dims)` for an integer,
`length(x)` for `:`, and the product of the sizes of the distinct dimensions in a tuple or vector.
"""
sum_length(x::AbstractArray, dims::Integer) = size(x, dims)
sum_length(x::AbstractArray, ::Colon) = length(x)
sum_length(x::AbstractArray, dims) = prod(size(x, d) for d in unique(dims); init = 1)

@non_differentiable sum_length(::Any, ::Any)

#####
##### Implementation: widening for the statistics
#####

"""
    widen_stats(x::AbstractArray)
    widen_stats(nothing) = nothing

`x` with the element type the statistics are computed in, [`_stat_type`](@ref)`(eltype(x))`:
`x` itself for `Float32` and `Float64` (no copy), a `Float32` copy for `Float16`. Its rule passes
the cotangent back projected onto `x` (converted to `eltype(x)`), so that Zygote differentiates
through it without reasoning about conversions.
"""
function widen_stats(x::AbstractArray{T}) where {T <: AbstractFloat}
    return _stat_type(T) === T ? x : _widen.(x)
end
widen_stats(x::AbstractArray) = x
widen_stats(::Nothing) = nothing

function ChainRulesCore.rrule(::typeof(widen_stats), x::AbstractArray)
    project_x = ProjectTo(x)
    widen_stats_pullback(Δ) = (NoTangent(), project_x(unthunk(Δ)))
    return widen_stats(x), widen_stats_pullback
end

"""
    narrow_like(x::AbstractArray, y::AbstractArray)

`y` with the element type of `x`: `y` itself when they agree (no copy), else a converted copy
(a `Float32` result of `Float16` input goes back to `Float16`). Its rule passes the cotangent back
projected onto `y`; `x` gives only its type (a `ZeroTangent`).
"""
narrow_like(x::AbstractArray{T}, y::AbstractArray{T}) where {T} = y
narrow_like(x::AbstractArray{T}, y::AbstractArray) where {T} = copyto!(similar(y, T), y)

function ChainRulesCore.rrule(::typeof(narrow_like), x::AbstractArray, y::AbstractArray)
    project_y = ProjectTo(y)
    narrow_like_pullback(Δ) = (NoTangent(), ZeroTangent(), project_y(unthunk(Δ)))
    return narrow_like(x, y), narrow_like_pullback
end

#####
##### Implementation: the one-pass (Welford / Chan) reduction
#####

# A triple is (mean, M2, count) of a group of elements, where M2 is the sum of squared deviations
# from the group's mean. The empty group is the identity of `_chan_combine`. The count is an
# Int64: `dims = :` over more than 2^31 elements (8 GiB of Float32) would wrap an Int32 silently.
const _WELFORD_EMPTY = (0.0f0, 0.0f0, Int64(0))

_welford_leaf(a::Float32) = (a, 0.0f0, Int64(1))

# Chan, Golub & LeVeque's pairwise update. With k = k1 + k2 and δ = m2 - m1:
#   m  = m1 + δ k2 / k,        M2 = M2₁ + M2₂ + δ² k1 k2 / k.
# An empty side returns the other argument as it is, so the empty triple is a true identity, as a
# GPU reduction requires of `init` (through the formula, δ² overflows to Inf for |m| past
# sqrt(floatmax(Float32)) ≈ 1.8e19, and Inf * 0 made M2 NaN).
function _chan_combine(a::Tuple{Float32, Float32, Int64}, b::Tuple{Float32, Float32, Int64})
    m1, s1, k1 = a
    m2, s2, k2 = b
    k = k1 + k2
    iszero(k) && return _WELFORD_EMPTY # two empty groups, e.g. idle threads on a GPU
    iszero(k1) && return b
    iszero(k2) && return a
    w = Float32(k2) / Float32(k)
    δ = m2 - m1
    return (muladd(δ, w, m1), s1 + s2 + δ * δ * Float32(k1) * w, k)
end

_welford_mean(t::Tuple) = t[1]
_welford_var(t::Tuple, λ) = t[2] * λ

# `mapreduce` returns a scalar triple for `dims = :`, else an array of triples.
_split_welford(R::Tuple, λ) = (; mean = _welford_mean(R), var = _welford_var(R, λ))
function _split_welford(R::AbstractArray, λ)
    return (; mean = _welford_mean.(R), var = _welford_var.(R, λ))
end

#####
##### Rule
#####

function ChainRulesCore.rrule(
    ::typeof(mean_var),
    A::AbstractArray{<:Real};
    dims,
    corrected::Bool = false,
)
    stats = mean_var(A; dims, corrected)
    μ = stats.mean
    T = float(eltype(A))
    N = sum_length(A, dims)
    invN = inv(T(N))
    twoλ = T(2) / T(N - corrected)
    project_A = ProjectTo(A)
    function mean_var_pullback(Δ)
        Δstats = unthunk(Δ)
        Δμ = _strong_zero(unthunk(Δstats.mean))
        Δσ² = _strong_zero(unthunk(Δstats.var))
        ∂A = Δμ .* invN .+ Δσ² .* twoλ .* (A .- μ)
        return (NoTangent(), project_A(∂A))
    end
    return stats, mean_var_pullback
end

# An absent part of the cotangent (ZeroTangent) acts as `false`, Julia's strong zero.
_strong_zero(::AbstractZero) = false
_strong_zero(Δ) = Δ
