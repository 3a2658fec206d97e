#####
##### API: measure one implementation, as rows of the shared result schema
#####

"""
    RESULT_FIELDS

The columns of a benchmark row, in order: the long-format schema shared with the Python harness.
[`measure_forward`](@ref) and [`measure_gradient`](@ref) return `NamedTuple`s with exactly these
fields, and [`write_csv`](@ref) writes them in this order.
"""
const RESULT_FIELDS = (
    :op,
    :impl,
    :side,
    :peer,
    :device,
    :device_name,
    :dtype,
    :shape,
    :causal,
    :mode,
    :ms_p20,
    :ms_p50,
    :ms_p80,
    :gbps,
    :tflops,
    :alloc_bytes,
    :peak_bytes,
    :relerr,
    :versions,
    :timestamp,
)

"""
    measure_forward(f, x; op, impl, repeats=20, warmup=3) -> NamedTuple

Time `f(x)` and count what one call allocates, on the device `x` lives on, and return one row of
the result schema ([`RESULT_FIELDS`](@ref)) with `mode = "fwd"`.

- `op`, `impl`: the op name (`"normalise"`, `"layer_norm"`, `"layer_norm_maxstd"`) and the
  implementation name (the Julia function's name, e.g. `"normal_new"`). Bind other arguments in
  a closure: `measure_forward(x -> layer_norm(α, β, x), x; op="layer_norm_maxstd", impl="layer_norm")`.
- Timing: `warmup` untimed calls, then `repeats` calls timed one by one; `ms_p20`, `ms_p50`,
  `ms_p80` are the 20th, 50th and 80th percentiles in milliseconds. On the CPU each call is timed
  with `time_ns()`; on a `CuArray` (with CUDA.jl loaded) with `CUDA.@elapsed`, after a
  synchronisation.
- `alloc_bytes`: the bytes one more call allocates, `@allocated` on the CPU (Julia heap) and
  `CUDA.@allocated` on a GPU (device memory from CUDA.jl's allocator, a total, not a peak).
  `peak_bytes` is `missing`: neither counter gives a peak.
- `gbps`: `2 * length(x) * sizeof(eltype(x))` bytes (read `x`, write `y`) over the median time.
- `relerr`: `‖y - y64‖₂ / ‖y64‖₂` (as on the Python side) where `y64 = f(Float64.(x))` is the same
  function evaluated in `Float64` on the same device (note that a default `eps` which depends on
  the element type is part of the difference).
- `shape`: torch's row-major shape, `size(x)` reversed and joined by `x`: a Julia `N×M` array
  with the features along `dims = 1` is `"MxN"`. `dtype` uses Python's names (`"float32"`).
"""
function measure_forward(
    f,
    x::AbstractArray;
    op::AbstractString,
    impl::AbstractString,
    repeats::Integer = 20,
    warmup::Integer = 3,
)
    backend = measure_backend(x)
    timing = _measure(backend, () -> f(x); repeats, warmup)
    relerr = _relerr(f(x), f(_float64(x)))
    return _result_row(
        backend,
        x;
        op,
        impl,
        mode = "fwd",
        timing,
        relerr,
        bytes = 2 * _nbytes(x),
        versions = "",
    )
end

"""
    measure_gradient(pullback, f, x; op, impl, mode="fwd+bwd", repeats=20, warmup=3, seed=1234)
        -> NamedTuple

Time the backward pass of `f` at `x` with a fixed random cotangent `dy` (drawn from
`Random.Xoshiro(seed)`, the same for every implementation of the same shape), and return one
row of the result schema ([`RESULT_FIELDS`](@ref)).

`pullback` is the AD system's pullback, passed in by the caller so that CrossFuse does not depend
on one: `Zygote.pullback` (`y, back = pullback(f, x)`, `back(dy)[1]` is `∂x`).

- `mode = "bwd"`: time `back(dy)` alone, with `back` from one earlier `pullback(f, x)`;
  `gbps` counts `3 * length(x) * sizeof(eltype(x))` bytes (read `x`, `dy`, write `∂x`).
- `mode = "fwd+bwd"`: time `pullback(f, x)` followed by `back(dy)`; `gbps` counts `5 * ...`.

Timing, `alloc_bytes`, `peak_bytes`, `shape` and `dtype` as in [`measure_forward`](@ref);
`relerr` compares `∂x` against the `Float64` evaluation of the same pullback with the same `dy`.
`versions` also names the package `pullback` comes from (e.g. `Zygote=0.7.3`).
"""
function measure_gradient(
    pullback,
    f,
    x::AbstractArray;
    op::AbstractString,
    impl::AbstractString,
    mode::AbstractString = "fwd+bwd",
    repeats::Integer = 20,
    warmup::Integer = 3,
    seed::Integer = 1234,
)
    if !(mode in ("bwd", "fwd+bwd"))
        throw(ArgumentError(
            "measure_gradient: mode must be \"bwd\" or \"fwd+bwd\", got \"$mode\"",
        ))
    end
    backend = measure_backend(x)
    y, back = pullback(f, x)
    dy = _random_like(y, seed)
    run = mode == "bwd" ? (() -> back(dy)) : (() -> last(pullback(f, x))(dy))
    timing = _measure(backend, run; repeats, warmup)
    _, back64 = pullback(f, _float64(x))
    relerr = _relerr(_first_gradient(back(dy)), _first_gradient(back64(_float64(dy))))
    return _result_row(
        backend,
        x;
        op,
        impl,
        mode,
        timing,
        relerr,
        bytes = (mode == "bwd" ? 3 : 5) * _nbytes(x),
        versions = _module_version(parentmodule(pullback)),
    )
end

"""
    write_csv(io::IO, rows)
    write_csv(path::AbstractString, rows) -> path

Write `rows` (`NamedTuple`s with the fields [`RESULT_FIELDS`](@ref)) as CSV: a header line, then
one line per row, in the order of `RESULT_FIELDS`. `missing` and `nothing` are empty fields,
`Bool`s are `true`/`false`, numbers are written by `string`, and a text field that holds a comma,
a quote or a line break is quoted (`"`, with inner quotes doubled). A path's folder is created
if needed.
"""
function write_csv(io::IO, rows)
    println(io, join(RESULT_FIELDS, ","))
    for row in rows
        println(
            io,
            join((_csv_field(getproperty(row, field)) for field in RESULT_FIELDS), ","),
        )
    end
    return io
end

function write_csv(path::AbstractString, rows)
    mkpath(dirname(abspath(path)))
    open(io -> write_csv(io, rows), path, "w")
    return path
end

#####
##### Backends: where the arrays live decides how to time them
#####

"""
    MeasureBackend

How calls are timed and their allocations counted: [`CPUMeasure`](@ref) for any array, or
[`CUDAMeasure`](@ref) for a `CuArray` once CUDA.jl is loaded (its methods live in the extension
`CrossFuseCUDAExt`). [`measure_backend`](@ref) picks one from the input array.
"""
abstract type MeasureBackend end

"""
    CPUMeasure()

Time with `time_ns()`, count bytes with `@allocated` (the Julia heap).
"""
struct CPUMeasure <: MeasureBackend end

"""
    CUDAMeasure()

Time with `CUDA.@elapsed`, count bytes with `CUDA.@allocated`. Its methods are defined by the
extension `CrossFuseCUDAExt`, loaded together with CUDA.jl.
"""
struct CUDAMeasure <: MeasureBackend end

"""
    measure_backend(x) -> MeasureBackend

[`CPUMeasure`](@ref) for any array (including `JLArray`, which lives on the CPU);
the CUDA extension adds [`CUDAMeasure`](@ref) for `CuArray`.
"""
measure_backend(::AbstractArray) = CPUMeasure()

device_label(::CPUMeasure) = "cpu"
device_name(::CPUMeasure) = String(strip(Sys.cpu_info()[1].model))
backend_versions(::CPUMeasure) = ""
synchronize_backend(::CPUMeasure) = nothing

# Seconds taken by one call of `run()`.
function time_one(::CPUMeasure, run)
    t0 = time_ns()
    run()
    t1 = time_ns()
    return (t1 - t0) / 1.0e9
end

# Bytes allocated by one call of `run()`.
bytes_one(::CPUMeasure, run) = @allocated run()

# Without its extension, a backend has no timer: say what to load.
function _no_backend(backend::MeasureBackend)
    throw(ArgumentError(
        "no measurement methods for $(backend): load CUDA.jl (`using CUDA`) so that " *
            "CrossFuse's extension CrossFuseCUDAExt defines them",
    ))
end
device_label(backend::MeasureBackend) = _no_backend(backend)
device_name(backend::MeasureBackend) = _no_backend(backend)
backend_versions(backend::MeasureBackend) = _no_backend(backend)
synchronize_backend(backend::MeasureBackend) = _no_backend(backend)
time_one(backend::MeasureBackend, run) = _no_backend(backend)
bytes_one(backend::MeasureBackend, run) = _no_backend(backend)

#####
##### Implementation
#####

function _measure(backend::MeasureBackend, run; repeats::Integer, warmup::Integer)
    repeats >= 1 || throw(ArgumentError("repeats must be at least 1, got $repeats"))
    warmup >= 0 || throw(ArgumentError("warmup must be at least 0, got $warmup"))
    for _ in 1:warmup
        run()
    end
    synchronize_backend(backend)
    ms = [1000 * time_one(backend, run) for _ in 1:repeats]
    alloc_bytes = Int(bytes_one(backend, run))
    return (;
        ms_p20 = quantile(ms, 0.2),
        ms_p50 = quantile(ms, 0.5),
        ms_p80 = quantile(ms, 0.8),
        alloc_bytes,
    )
end

function _result_row(
    backend::MeasureBackend,
    x::AbstractArray;
    op,
    impl,
    mode,
    timing,
    relerr,
    bytes,
    versions,
)
    return (;
        op = String(op),
        impl = String(impl),
        side = "julia",
        peer = false,
        device = device_label(backend),
        device_name = device_name(backend),
        dtype = dtype_name(eltype(x)),
        shape = shape_string(x),
        causal = missing,
        mode = String(mode),
        ms_p20 = timing.ms_p20,
        ms_p50 = timing.ms_p50,
        ms_p80 = timing.ms_p80,
        gbps = bytes / (timing.ms_p50 / 1000) / 1.0e9,
        tflops = missing,
        alloc_bytes = timing.alloc_bytes,
        peak_bytes = missing,
        relerr,
        versions = _versions_string(backend, versions),
        timestamp = _utc_timestamp(),
    )
end

"""
    dtype_name(T) -> String

Python's name for the element type: `"float32"`, `"float64"`, `"float16"`, `"bfloat16"`.
"""
dtype_name(::Type{T}) where {T} = lowercase(string(nameof(T)))

"""
    shape_string(x) -> String

torch's row-major shape of the same memory: `size(x)` reversed, joined by `x` (`N×M` → `"MxN"`).
"""
shape_string(x::AbstractArray) = join(reverse(size(x)), "x")

_nbytes(x::AbstractArray) = length(x) * sizeof(eltype(x))
_float64(x::AbstractArray) = Float64.(x)

function _random_like(y::AbstractArray, seed::Integer)
    host = convert(Array{eltype(y)}, Random.randn(Random.Xoshiro(seed), Float64, size(y)))
    return copyto!(similar(y), host)
end

_first_gradient(grads::Tuple) = _first_gradient(first(grads))
_first_gradient(dx::AbstractArray) = dx
function _first_gradient(dx)
    throw(ArgumentError(
        "measure_gradient: the pullback gave no array gradient for x, got $(dx)",
    ))
end

# Norm-wise relative error, computed on the host.
# ‖y - ref‖₂ / ‖ref‖₂ in Float64, the definition crossfuse's Python side uses (tolerances.relerr);
# an all-zero reference gives the absolute error.
function _relerr(y::AbstractArray, reference::AbstractArray)
    a = Float64.(Array(y))
    b = Float64.(Array(reference))
    scale = sqrt(sum(abs2, b))
    err = sqrt(sum(abs2, a .- b))
    return iszero(scale) ? err : err / scale
end

function _module_version(m::Module)
    version = Base.pkgversion(m)
    return "$(nameof(m))=$(version === nothing ? "unknown" : version)"
end

function _versions_string(backend::MeasureBackend, extra::AbstractString)
    parts = [
        "julia=$(VERSION)",
        _module_version(@__MODULE__),
        backend_versions(backend),
        extra,
    ]
    return join(filter(!isempty, parts), " ")
end

_utc_timestamp() = Dates.format(Dates.now(Dates.UTC), "yyyy-mm-dd\\THH:MM:SS") * "Z"

_csv_field(::Missing) = ""
_csv_field(::Nothing) = ""
_csv_field(b::Bool) = b ? "true" : "false"
_csv_field(v::Real) = string(v)
function _csv_field(s::AbstractString)
    needs_quotes = any(c -> c in (',', '"', '\n', '\r'), s)
    return needs_quotes ? string('"', replace(s, "\"" => "\"\""), '"') : String(s)
end
_csv_field(v) = _csv_field(string(v))
