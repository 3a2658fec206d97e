"""
    CrossFuseBridge

The Julia half of the Python package `crossfuse_julia`: included into `Main` by the bridge (through
juliacall), it calls the variants of `CrossFuse` on arrays that live in Python's memory.

Layout: a C-contiguous torch tensor of shape `(M, N)` is, on the same memory, a column-major Julia
array of size `(N, M)`; the features are along `dims = 1`. Python passes the sizes `n = N`,
`m = M` with every call, and each array in one of two forms, which [`wrap`](@ref) turns into a Julia
array on the same memory with `DLPack.from_dlpack` (no copy):

- CPU: the NumPy view `t.numpy().T` (size `(N, M)`, strides `(1, N)`), which arrives as a `PyArray`
  and is wrapped as an `Array`. Results go back as fresh Julia `Array`s, which Python views through
  NumPy without a copy.
- CUDA: the torch tensor itself, wrapped as a `CuArray`. Python allocates the outputs and Julia
  writes into them (`DLPack.share` relies on `CUDA.Mem`, which CUDA.jl 5.4 removed). Python
  synchronises torch before the call; Julia calls [`synchronize`](@ref) before it returns.

Gradients come from `Zygote.pullback`, which uses CrossFuse's `ChainRulesCore.rrule`s where it has
them. Nothing here is differentiated itself.
"""
module CrossFuseBridge

using CrossFuse: CrossFuse
using DLPack: DLPack
using Zygote: Zygote

#####
##### The variants and the calling convention of each op (features along dims = 1)
#####

"""
    VARIANTS

The CrossFuse functions the bridge may call, by name (the implementation names of the registry).
"""
const VARIANTS = Dict{String, Function}(
    "normal_now" => CrossFuse.normal_now,
    "normal_new" => CrossFuse.normal_new,
    "normal_newer" => CrossFuse.normal_newer,
    "layernorm" => CrossFuse.layernorm,
    "layer_norm" => CrossFuse.layer_norm,
)

function variant(name::AbstractString)
    f = get(VARIANTS, name, nothing)
    if f === nothing
        throw(ArgumentError(
            "no CrossFuse variant \"$name\"; known: $(join(sort!(collect(keys(VARIANTS))), ", "))",
        ))
    end
    return f
end

"""
    apply(op, f, eps, x, w, b)

Call the variant `f` with the calling convention of `op` (a `Val` of the op's name):
`normalise`: `f(x; dims=1, eps)`; `layer_norm`: `f(x, w, b; dims=1, eps)`;
`layer_norm_maxstd`: `f(eps, w, b, x)`. `w` and `b` are vectors of length `size(x, 1)` or `nothing`.
"""
apply(::Val{:normalise}, f, eps, x, w, b) = f(x; dims = 1, eps = eps)
apply(::Val{:layer_norm}, f, eps, x, w, b) = f(x, w, b; dims = 1, eps = eps)
apply(::Val{:layer_norm_maxstd}, f, eps, x, w, b) = f(eps, w, b, x)
function apply(::Val{op}, f, eps, x, w, b) where {op}
    throw(ArgumentError(
        "unknown op \"$op\"; known: normalise, layer_norm, layer_norm_maxstd",
    ))
end

opval(op::AbstractString) = Val(Symbol(op))

# Output, ∂x, ∂w, ∂b of the variant at (x, w, b) for the cotangent dy.
function pullback(op::Val, f, eps, x, w, b, dy)
    y, back = Zygote.pullback((x, w, b) -> apply(op, f, eps, x, w, b), x, w, b)
    dx, dw, db = back(dy)
    return y, dx, dw, db
end

#####
##### Arrays in: NumPy views (CPU) or torch tensors (CUDA), through DLPack
#####

"""
    wrap(t, dims...) -> Array or CuArray

The Python array `t` as a Julia array of size `dims` on the same memory: `DLPack.from_dlpack`
(an `Array` for a NumPy view, which arrives as a `PyArray`; a `CuArray` for a torch CUDA tensor),
then a reshape. For a contiguous buffer the reshape only settles which of the two orders DLPack.jl
picked when a dimension has size 1. The wrapped array keeps the Python object alive.
"""
wrap(t, dims::Integer...) = reshape(DLPack.from_dlpack(t), dims...)
wrap(::Nothing, dims::Integer...) = nothing

#####
##### CPU: results back as fresh Julia arrays, which Python views through NumPy
#####

# A result Python may keep: a fresh `Array` that shares no memory with the arguments.
owned(y, args...) = y # nothing, or a number
function owned(y::AbstractArray, args...)
    y isa Array || return Array(y)
    aliased = any(a -> a isa AbstractArray && Base.mightalias(y, a), args)
    return aliased ? copy(y) : y
end

function host_forward(op::AbstractString, name::AbstractString, x, w, b, eps::Real, n, m)
    xa, wa, ba = wrap(x, n, m), wrap(w, n), wrap(b, n)
    y = apply(opval(op), variant(name), eps, xa, wa, ba)
    return owned(y, xa, wa, ba)
end

function host_pullback(
    op::AbstractString,
    name::AbstractString,
    x,
    w,
    b,
    eps::Real,
    dy,
    n,
    m,
)
    xa, wa, ba, dya = wrap(x, n, m), wrap(w, n), wrap(b, n), wrap(dy, n, m)
    y, dx, dw, db = pullback(opval(op), variant(name), eps, xa, wa, ba, dya)
    args = (xa, wa, ba, dya)
    return (owned(y, args...), owned(dx, args...), owned(dw, args...), owned(db, args...))
end

#####
##### CUDA: outputs allocated by Python, written by Julia
#####

const CUDA_MODULE = Ref{Union{Module, Nothing}}(nothing)

"""
    use_cuda(CUDA::Module)

Switch the GPU path on, once CUDA.jl is loaded (the bridge passes the module in, so that this
file does not depend on CUDA.jl).
"""
use_cuda(m::Module) = (CUDA_MODULE[] = m; nothing)

function cuda()
    m = CUDA_MODULE[]
    m === nothing &&
        throw(ArgumentError("the GPU path is off: CUDA.jl was not loaded by the bridge"))
    return m
end

"""
    synchronize()

Wait for the GPU work of this task's stream (`CUDA.synchronize()`); nothing without the GPU path.
"""
function synchronize()
    m = CUDA_MODULE[]
    m === nothing || m.synchronize()
    return nothing
end

# CUDA.jl's device ordinals start at 0, like torch's device indices.
select_device(ordinal::Integer) = (cuda().device!(ordinal); nothing)

# Write a result into a Python-allocated output (a gradient that is absent is zero).
store!(::Nothing, y) = nothing
store!(::Nothing, ::Nothing) = nothing
store!(out, ::Nothing) = (fill!(out, zero(eltype(out))); nothing)
store!(out, y) = (copyto!(out, y); nothing)

function device_forward(
    out,
    op::AbstractString,
    name::AbstractString,
    x,
    w,
    b,
    eps::Real,
    n,
    m,
    ordinal,
)
    select_device(ordinal)
    xa, wa, ba = wrap(x, n, m), wrap(w, n), wrap(b, n)
    y = apply(opval(op), variant(name), eps, xa, wa, ba)
    store!(wrap(out, n, m), y)
    synchronize()
    return nothing
end

function device_pullback(
    y_out,
    dx_out,
    dw_out,
    db_out,
    op::AbstractString,
    name::AbstractString,
    x,
    w,
    b,
    eps::Real,
    dy,
    n,
    m,
    ordinal,
)
    select_device(ordinal)
    xa, wa, ba, dya = wrap(x, n, m), wrap(w, n), wrap(b, n), wrap(dy, n, m)
    y, dx, dw, db = pullback(opval(op), variant(name), eps, xa, wa, ba, dya)
    store!(wrap(y_out, n, m), y)
    store!(wrap(dx_out, n, m), dx)
    store!(wrap(dw_out, n), dw)
    store!(wrap(db_out, n), db)
    synchronize()
    return nothing
end

#####
##### Measurement: CrossFuse's helpers, rows of the shared result schema
#####

# A result row as (names, values) tuples, which reach Python as tuples of str and plain values.
row_pairs(row::NamedTuple) = (map(String, keys(row)), map(plain, values(row)))
plain(::Missing) = nothing
plain(v) = v

function measure(
    op::AbstractString,
    name::AbstractString,
    mode::AbstractString,
    x,
    w,
    b,
    eps::Real;
    kw...,
)
    f = variant(name)
    opv = opval(op)
    g = x -> apply(opv, f, eps, x, w, b)
    row = if mode == "fwd"
        CrossFuse.measure_forward(g, x; op, impl = name, kw...)
    else
        CrossFuse.measure_gradient(Zygote.pullback, g, x; op, impl = name, mode, kw...)
    end
    return row_pairs(row)
end

function host_measure(
    op::AbstractString,
    name::AbstractString,
    mode::AbstractString,
    x,
    w,
    b,
    eps::Real,
    n,
    m;
    kw...,
)
    return measure(op, name, mode, wrap(x, n, m), wrap(w, n), wrap(b, n), eps; kw...)
end

function device_measure(
    op::AbstractString,
    name::AbstractString,
    mode::AbstractString,
    x,
    w,
    b,
    eps::Real,
    n,
    m,
    ordinal;
    kw...,
)
    select_device(ordinal)
    row = measure(op, name, mode, wrap(x, n, m), wrap(w, n), wrap(b, n), eps; kw...)
    synchronize()
    return row
end

end # module CrossFuseBridge
