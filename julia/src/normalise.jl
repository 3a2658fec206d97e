#####
##### API: three implementations of the op `normalise`, y = (x - μ) / sqrt(σ² + ε)
#####

"""
    normal_now(x; dims=1, eps=eps(float(eltype(x))))

Normalise `x` over `dims` (op `normalise`):

    μ  = mean(x; dims)
    σ² = mean(abs2, x .- μ; dims)              # biased variance
    y  = (x .- μ) ./ sqrt.(σ² .+ eps)

`eps` is added to the variance, inside the square root; by default it is the machine epsilon of
`float(eltype(x))` (`2.2e-16` for `Float64`, `1.2f-7` for `Float32`). `dims` is an integer, a
tuple of integers or `:`.

The plain form (what Flux's `LayerNorm` computed): `Statistics.mean` and `Statistics.var`, then one
square root per element. For `Float16` input the statistics, `eps` and the arithmetic are in
`Float32` and `y` is converted back to `Float16` (as torch and the Python side do). It has no
custom rule: Zygote differentiates it through the rules for `mean`, `var`, broadcasting and the
widening helpers, and keeps several full-size intermediates for the backward pass.
"""
function normal_now(x::AbstractArray; dims = 1, eps::Real = _default_eps(x))
    xw = widen_stats(x) # one element type inside the broadcasts Zygote differentiates
    μ, σ² = _moments(xw, dims)
    return narrow_like(x, _normalise_div(xw, μ, σ², _eps_like(x, eps)))
end

"""
    normal_new(x; dims=1, eps=eps(float(eltype(x))))

The op `normalise` over `dims`, `y = (x - μ) / sqrt(σ² + eps)`, computed as

    μ    = mean(x; dims)
    σ²   = mean(abs2, x .- μ; dims)            # biased variance
    istd = inv.(sqrt.(σ² .+ eps))              # one square root per slice, not per element
    y    = (x .- μ) .* istd

with the same `eps` convention and default as [`normal_now`](@ref).

Rule: a `ChainRulesCore.rrule` whose pullback saves `x`, `μ`, `istd` (one value per slice) and
`y`, and allocates one full-size temporary, `tmp = dy .* (x .- μ)`, which it then overwrites
with the result:

    dx = istd .* (dy .- sum(dy; dims) ./ N .- y .* istd .* sum(tmp; dims) ./ N)

where `N = sum_length(x, dims)` is the number of elements per slice.
"""
function normal_new(x::AbstractArray; dims = 1, eps::Real = _default_eps(x))
    μ, σ² = _moments(widen_stats(x), dims)
    return narrow_like(x, first(_normalise_istd(x, μ, σ², _eps_like(x, eps))))
end

"""
    normal_newer(x; dims=1, eps=eps(float(eltype(x))))

The op `normalise` over `dims`, `y = (x - μ) / sqrt(σ² + eps)`, with the statistics from
[`mean_var`](@ref) (one pass on a `Float32` GPU array). Same `eps` convention and default as
[`normal_now`](@ref).

- any `AbstractArray`: `y = (x .- μ) .* istd` with `istd = inv.(sqrt.(σ² .+ eps))`, as
  [`normal_new`](@ref);
- `AbstractGPUArray`: `y = (x .- μ) ./ sqrt.(σ² .+ eps)`, one fused kernel: on a GPU the extra
  square roots cost nothing next to the memory traffic.

Rule: a `ChainRulesCore.rrule` for each method, with the memory-saving pullback of
[`normal_new`](@ref): it saves `x`, `μ`, the per-slice scale (`istd`, or `s = sqrt.(σ² .+ eps)` on
a GPU array) and `y`, and allocates one full-size temporary, `tmp = dy .* (x .- μ)`, overwritten
with `dx`. On a GPU array the same formula is written with divisions by `s`.
"""
function normal_newer(x::AbstractArray; dims = 1, eps::Real = _default_eps(x))
    stats = mean_var(x; dims, corrected = false)
    return narrow_like(
        x,
        first(_normalise_istd(x, stats.mean, stats.var, _eps_like(x, eps))),
    )
end

function normal_newer(x::AbstractGPUArray; dims = 1, eps::Real = _default_eps(x))
    stats = mean_var(x; dims, corrected = false)
    return narrow_like(x, _normalise_div(x, stats.mean, stats.var, _eps_like(x, eps)))
end

#####
##### Implementation
#####

_default_eps(x::AbstractArray) = Base.eps(float(eltype(x)))
# eps in the type of the statistics (Float32 for Float16 input), as it is added to σ².
_eps_like(x::AbstractArray, eps::Real) = convert(_stat_type(float(eltype(x))), eps)

@non_differentiable _default_eps(::Any)
@non_differentiable _eps_like(::Any, ::Any)

# μ and the biased σ² over `dims` in two passes, of `xw = widen_stats(x)`: in
# `_stat_type(eltype(x))`, so that Float16 data is summed in Float32 (Statistics.mean and var
# reduce in the element type, where a Float16 sum overflows past 65504 and rounds at every step).
function _moments(xw::AbstractArray, dims)
    μ = mean(xw; dims)
    return μ, var(xw; dims, mean = μ, corrected = false)
end

# y = (x - μ) / sqrt(σ² + ε), one square root per element, fused into one broadcast.
_normalise_div(x, μ, σ², ε) = (x .- μ) ./ sqrt.(σ² .+ ε)

# The same y through the per-slice inverse standard deviation; returns (y, istd).
function _normalise_istd(x, μ, σ², ε)
    istd = inv.(sqrt.(σ² .+ ε))
    return (x .- μ) .* istd, istd
end

# 1 / N in the type the pullbacks sum in (`_stat_type`: Float32 for Float16 `y`, where N past
# 65504 would be Inf), N the number of elements per slice.
_inv_count(y, x, dims) = inv(convert(_stat_type(eltype(y)), sum_length(x, dims)))

@non_differentiable _inv_count(::Any, ::Any, ::Any)

# The backward pass of y = (x - μ) istd, istd = (σ² + ε)^(-1/2), σ² the biased variance.
# With ∂istd/∂x_j = -istd³ (x_j - μ) / N:
#   dx = istd (dy - Σdy / N - y istd Σ(dy (x - μ)) / N),   sums over `dims`.
# On entry `tmp` holds dy .* (x .- μ) (`_dy_times_centred`); the sums are taken before the
# broadcast overwrites it. Both sums are in `_stat_type` (a Float16 Σdy would overflow past 65504).
function _normal_dx_istd!(tmp, dy, y, istd, invN, dims)
    tmp .= istd .*
        (dy .- invN .* sum(_widen, dy; dims) .- y .* istd .* invN .* sum(tmp; dims))
    return tmp
end

# The same dx with s = sqrt(σ² + ε) = 1 / istd, written with divisions:
#   dx = (dy - Σdy / N - y Σ(dy (x - μ)) / (N s)) / s.
# (The seed's GPU pullback computed (dy - (Σdy - y Σ(dy (x - μ))) / N) / s: the last term with the
# wrong sign and one factor 1/s short. The tests compare this method with the istd one in Float64.)
function _normal_dx_div!(tmp, dy, y, s, invN, dims)
    tmp .= (dy .- invN .* sum(_widen, dy; dims) .- y .* (invN .* sum(tmp; dims)) ./ s) ./ s
    return tmp
end

# The pullbacks' one full-size temporary, dy .* (x .- μ), in `_stat_type` (Float32 for Float16
# cotangents: twice the temporary's bytes there, and sums that do not overflow).
_dy_times_centred(dy, x, μ) = _widen.(dy) .* (x .- μ)

#####
##### Rules
#####

function ChainRulesCore.rrule(
    ::typeof(normal_new),
    x::AbstractArray;
    dims = 1,
    eps::Real = _default_eps(x),
)
    μ, σ² = _moments(widen_stats(x), dims)
    yw, istd = _normalise_istd(x, μ, σ², _eps_like(x, eps))
    y = narrow_like(x, yw)
    invN = _inv_count(y, x, dims)
    project_x = ProjectTo(x)
    function normal_new_pullback(Δ)
        dy = unthunk(Δ)
        dx = _normal_dx_istd!(_dy_times_centred(dy, x, μ), dy, y, istd, invN, dims)
        return (NoTangent(), project_x(dx))
    end
    return y, normal_new_pullback
end

function ChainRulesCore.rrule(
    ::typeof(normal_newer),
    x::AbstractArray;
    dims = 1,
    eps::Real = _default_eps(x),
)
    stats = mean_var(x; dims, corrected = false)
    μ = stats.mean
    yw, istd = _normalise_istd(x, μ, stats.var, _eps_like(x, eps))
    y = narrow_like(x, yw)
    invN = _inv_count(y, x, dims)
    project_x = ProjectTo(x)
    function normal_newer_pullback(Δ)
        dy = unthunk(Δ)
        dx = _normal_dx_istd!(_dy_times_centred(dy, x, μ), dy, y, istd, invN, dims)
        return (NoTangent(), project_x(dx))
    end
    return y, normal_newer_pullback
end

function ChainRulesCore.rrule(
    ::typeof(normal_newer),
    x::AbstractGPUArray;
    dims = 1,
    eps::Real = _default_eps(x),
)
    stats = mean_var(x; dims, corrected = false)
    μ = stats.mean
    ε = _eps_like(x, eps)
    y = narrow_like(x, _normalise_div(x, μ, stats.var, ε))
    s = sqrt.(stats.var .+ ε) # one value per slice
    invN = _inv_count(y, x, dims)
    project_x = ProjectTo(x)
    function normal_newer_pullback(Δ)
        dy = unthunk(Δ)
        dx = _normal_dx_div!(_dy_times_centred(dy, x, μ), dy, y, s, invN, dims)
        return (NoTangent(), project_x(dx))
    end
    return y, normal_newer_pullback
end
