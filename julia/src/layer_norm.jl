#####
##### API: the op `layer_norm_maxstd`, y = α (x - μ) / max(σ, ϵ) + β, single pass
#####

"""
    MAXSTD_DEFAULT_EPS = 1e-5

The default `epsilon` of [`layer_norm`](@ref).
"""
const MAXSTD_DEFAULT_EPS = 1.0e-5

"""
    layer_norm([epsilon,] alpha, beta, x)

Layer normalisation over `dims = 1` in the NeuralAttentionlib form (op `layer_norm_maxstd`):

    s₁ = sum(x; dims=1),  s₂ = sum(abs2, x; dims=1)      # one pass, one mapreduce
    μ  = s₁ / N,          σ = sqrt(max(s₂ / N - μ², 0))   # N = size(x, 1); biased std
    y  = α .* (x .- μ) ./ max.(σ, epsilon) .+ β

`epsilon` (default [`MAXSTD_DEFAULT_EPS`](@ref) `= 1e-5`) is a floor on the standard deviation,
`max(σ, ϵ)`, **not** added to the variance as in `sqrt(σ² + ϵ)`: this is a different op from
[`layernorm`](@ref). It must be positive. `s₂ / N - μ²` is evaluated as
`fma(μ, -μ, s₂ / N)` and clamped at zero, because rounding can make it slightly negative.

`alpha` and `beta` are each `nothing` (meaning 1 and 0), a number, or a vector of length
`size(x, 1)`. `x` is an array of floats with the features along its first dimension; any
further dimensions are independent slices. `y` has `eltype(x)`. The statistics, `epsilon` and
`n` below are in `eltype(x)`, or in `Float32` for `Float16` input (whose sums overflow at 65504,
and for which `1 / 1e-5` is already out of range).

The single pass reads `x` once for the statistics, but `s₂ / N - μ²` cancels: in `Float32`, data
whose mean is large next to its spread (`1e4 .+ randn`) loses most digits of `σ` (see the tests).
Use [`normal_newer`](@ref) or [`layernorm`](@ref) for such data.

Rule: a `ChainRulesCore.rrule` for both methods, returning `NoTangent()` for `epsilon` and for
an `alpha` or `beta` that is `nothing`, and thunks for the others. The pullback saves the
normalised `n = (x .- μ) ./ max.(σ, ϵ)` (full size), `σ` and `1 / max(σ, ϵ)` (one value per
column); it allocates one full-size temporary for `∂x`, and one more for each of `∂alpha`,
`∂beta` that is asked for. With `g = Ȳ .* α` (sums over the first dimension):

    ∂x = (g .- sum(g) ./ N .- c .* n .* sum(g .* n) ./ N) ./ max.(σ, ϵ)
    ∂α = sum(Ȳ .* n) over all but the first dimension,   ∂β = sum(Ȳ) likewise

where `c = 1` if `σ > ϵ` and `c = 0` where the floor is active (then the denominator is the
constant `ϵ` and only the mean's dependence on `x` remains).
"""
function layer_norm(alpha, beta, x::AbstractArray{<:AbstractFloat})
    return layer_norm(MAXSTD_DEFAULT_EPS, alpha, beta, x)
end

function layer_norm(epsilon::Real, alpha, beta, x::AbstractArray{<:AbstractFloat})
    _check_affine(alpha, x, :alpha)
    _check_affine(beta, x, :beta)
    μ, σ₀ = _maxstd_stats(x)
    rσ = _inv_clamped_std(σ₀, _stat_eps(x, epsilon))
    T = eltype(x)
    return T.(muladd.(_one_if_nothing(alpha, x), (x .- μ) .* rσ, _zero_if_nothing(beta, x)))
end

#####
##### Implementation
#####

_value_and_square(v) = (v, v * v)
_add_pair(a::Tuple, b::Tuple) = (a[1] + b[1], a[2] + b[2])

_pair_mean(s::Tuple, invN) = s[1] * invN
function _pair_std(s::Tuple, invN)
    μ = s[1] * invN
    return sqrt(max(fma(μ, -μ, s[2] * invN), zero(μ)))
end

# The type of the statistics (μ, σ, 1 / max(σ, ϵ)) and of `n`: at least Float32, as on the Python
# side. In Float16 the sums overflow at 65504, and 1 / ϵ for the default ϵ = 1e-5 is already past
# Float16's largest value (a constant column would give 0 * Inf = NaN). The output is then
# converted back to `eltype(x)`; for Float32 and Float64 nothing changes.
_stat_type(::Type{T}) where {T <: AbstractFloat} = promote_type(T, Float32)
_stat_eps(x::AbstractArray, epsilon::Real) = convert(_stat_type(eltype(x)), epsilon)

@non_differentiable _stat_eps(::Any, ::Any)

_widen(v::T) where {T} = convert(_stat_type(T), v)
_widened_value_and_square(v) = _value_and_square(_widen(v))

# Column statistics in one pass: the mean μ and the biased standard deviation σ₀, each of size
# (1, size(x)[2:end]...), in `_stat_type(T)`. (0, 0) is a true identity of `_add_pair`, as a GPU
# `init` must be.
function _maxstd_stats(x::AbstractArray{T}) where {T <: AbstractFloat}
    S = _stat_type(T)
    invN = _inv_rows(x)
    s = mapreduce(
        _widened_value_and_square,
        _add_pair,
        x;
        dims = 1,
        init = (zero(S), zero(S)),
    )
    return _pair_mean.(s, invN), _pair_std.(s, invN)
end

_inv_rows(x::AbstractArray{T}) where {T} = convert(_stat_type(T), 1 // size(x, 1))
_inv_clamped_std(σ₀, ϵ) = inv.(max.(σ₀, ϵ))

_one_if_nothing(::Nothing, x) = one(eltype(x))
_one_if_nothing(a, x) = a
_zero_if_nothing(::Nothing, x) = zero(eltype(x))
_zero_if_nothing(b, x) = b

_check_affine(::Union{Nothing, Number}, x, name) = nothing
function _check_affine(p::AbstractVector, x, name)
    if length(p) != size(x, 1)
        throw(DimensionMismatch(
            "layer_norm: `$name` has length $(length(p)), expected size(x, 1) = $(size(x, 1))",
        ))
    end
    return nothing
end
function _check_affine(p, x, name)
    throw(ArgumentError(
        "layer_norm: `$name` must be `nothing`, a number or a vector of length " *
            "size(x, 1) = $(size(x, 1)); got a $(typeof(p))",
    ))
end

# ∂x of y = α n + β, n = (x - μ) / σ, σ = max(σ₀, ϵ), per column of N entries.
# Derivation: σ₀² = Σx²/N - μ², so ∂σ₀/∂x_j = (x_j - μ) / (N σ₀); and ∂σ/∂x_j = c ∂σ₀/∂x_j
# with c = 1 if σ₀ > ϵ, c = 0 if σ₀ ≤ ϵ (σ = ϵ is then constant; at σ₀ == ϵ this takes the
# same branch as ChainRules' rule for `max`). Where c = 1, σ = σ₀, so ∂σ/∂x_j = n_j / N. Hence
#   ∂n_i/∂x_j = (δ_ij - 1/N) / σ - n_i c n_j / (N σ),
# and with g = Ȳ α, ∂x_j = Σ_i g_i ∂n_i/∂x_j = (g_j - Σg / N - c n_j Σ(g n) / N) / σ:
# the usual layer-norm gradient when σ₀ > ϵ, and (g - mean(g)) / ϵ where the floor is active.
# One full-size temporary: it holds g, then g n, then ∂x (g is recomputed from Ȳ and α). It is
# allocated here, not taken from `Ȳ .* α`: for a `sum` loss Zygote passes Ȳ as a FillArrays `Fill`,
# and `Fill .* α` with a number α is another `Fill`, which cannot be written into.
# Ȳ is widened before it meets α: a Float16 Ȳ (loss scaling makes it large) times a Float16 α would
# round, and overflow past 65504, in Float16 before reaching the wider `tmp`.
function _maxstd_dx(Ȳ, α, n, σ₀, rσ, ϵ, invN)
    tmp = similar(n, promote_type(_stat_type(eltype(Ȳ)), eltype(n)))
    tmp .= _widen.(Ȳ) .* α
    sum_g = sum(tmp; dims = 1)
    tmp .*= n
    sum_gn = ifelse.(σ₀ .> ϵ, sum(tmp; dims = 1), zero(eltype(tmp)))
    tmp .= (_widen.(Ȳ) .* α .- (n .* sum_gn .+ sum_g) .* invN) .* rσ
    return tmp
end

# ∂α or ∂β from g = Ȳ .* n or g = Ȳ: everything but the first dimension summed away, each term
# widened to the statistics' type (a Float16 Ȳ summed in Float16 would overflow past 65504).
_affine_grad(::Number, g, N) = sum(_widen, g)
_affine_grad(::AbstractVector, g, N) = vec(sum(_widen, reshape(g, N, :); dims = 2))

#####
##### Rules
#####

function ChainRulesCore.rrule(
    ::typeof(layer_norm),
    epsilon::Real,
    alpha,
    beta,
    x::AbstractArray{T},
) where {T <: AbstractFloat}
    _check_affine(alpha, x, :alpha)
    _check_affine(beta, x, :beta)
    ϵ = _stat_eps(x, epsilon)
    μ, σ₀ = _maxstd_stats(x)
    rσ = _inv_clamped_std(σ₀, ϵ)
    n = (x .- μ) .* rσ
    α = _one_if_nothing(alpha, x)
    y = T.(muladd.(α, n, _zero_if_nothing(beta, x)))
    N = size(x, 1)
    invN = _inv_rows(x)
    project_alpha = ProjectTo(alpha)
    project_beta = ProjectTo(beta)
    project_x = ProjectTo(x)
    function layer_norm_pullback(Ybar)
        Ȳ = unthunk(Ybar)
        ∂α = if alpha === nothing
            NoTangent()
        else
            @thunk project_alpha(_affine_grad(alpha, Ȳ .* n, N))
        end
        ∂β = beta === nothing ? NoTangent() : @thunk project_beta(_affine_grad(beta, Ȳ, N))
        dx = @thunk project_x(_maxstd_dx(Ȳ, α, n, σ₀, rσ, ϵ, invN))
        # A lone non-zero cotangent gains nothing from a thunk (whoever asks for it unthunks it
        # at once): with neither alpha nor beta, ∂x is the only one, so it is computed now. A
        # style choice, not a tested one: ChainRulesTestUtils 1.x has no check for it.
        # (Both tests fold away at compile time.)
        ∂x = (alpha === nothing && beta === nothing) ? unthunk(dx) : dx
        return (NoTangent(), NoTangent(), ∂α, ∂β, ∂x)
    end
    return y, layer_norm_pullback
end

function ChainRulesCore.rrule(
    ::typeof(layer_norm),
    alpha,
    beta,
    x::AbstractArray{<:AbstractFloat},
)
    y, pullback = ChainRulesCore.rrule(layer_norm, MAXSTD_DEFAULT_EPS, alpha, beta, x)
    function layer_norm_pullback(Ybar)
        _, _, ∂α, ∂β, ∂x = pullback(Ybar)
        return (NoTangent(), ∂α, ∂β, ∂x)
    end
    return y, layer_norm_pullback
end
