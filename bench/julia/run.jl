# The Julia side of the crossfuse benchmark: times and allocations of the CrossFuse variants,
# forward and backward, written as CSV rows in the result schema shared with Python.
#
# Usage, from the repository root (the environment is the top-level Project.toml):
#
#     julia --project=. bench/julia/run.jl [--device cpu|cuda] [--out FILE.csv] [--quick]
#                                          [--dtype float32|float64] [--repeats N]
#
#   --device   cpu (default) or cuda. cuda needs CUDA.jl in the environment
#              (julia --project=. -e 'using Pkg; Pkg.add("CUDA")') and a working GPU.
#   --out      where to write the CSV (default: crossfuse-julia-<device>.csv in the current
#              folder); its folder is created if needed.
#   --quick    two small shapes and fewer repeats, for a smoke test.
#   --dtype    element type of the inputs (default float32).
#   --repeats  timed calls per measurement (default 20, or 5 with --quick).
#
# Shapes are Julia N×M arrays with the N features along dims = 1, i.e. torch's (M, N). The full
# run covers the seed's N×M = 100×100, 100×1000, 1000×10000 and M = 4096 with N = 1024, 4096.
# Each variant is measured in three modes: fwd (the call), bwd (the pullback alone, with a fixed
# random cotangent) and fwd+bwd (Zygote.pullback, then the pullback).
# One progress line is printed per row; the last line is `CSV written: <path>`.

using CrossFuse: CrossFuse, layer_norm, layernorm, measure_forward, measure_gradient
using CrossFuse: normal_new, normal_newer, normal_now, write_csv
using Random: Random
using Zygote: Zygote

const USAGE = "usage: julia --project=. bench/julia/run.jl [--device cpu|cuda] [--out FILE.csv] " *
    "[--quick] [--dtype float32|float64] [--repeats N]"

const DTYPES = Dict("float32" => Float32, "float64" => Float64)

function parse_options(args::Vector{String})
    device = "cpu"
    out = ""
    quick = false
    dtype = "float32"
    repeats = 0
    help = false
    i = 1
    while i <= length(args)
        arg = args[i]
        if arg == "--quick"
            quick = true
        elseif arg in ("--device", "--out", "--dtype", "--repeats")
            i < length(args) || error("$arg needs a value\n$USAGE")
            value = args[i + 1]
            i += 1
            if arg == "--device"
                device = value
            elseif arg == "--out"
                out = value
            elseif arg == "--dtype"
                dtype = value
            else
                repeats = parse(Int, value)
            end
        elseif arg in ("-h", "--help")
            help = true
        else
            error("unknown argument $(repr(arg))\n$USAGE")
        end
        i += 1
    end
    device in ("cpu", "cuda") || error("--device must be cpu or cuda, got $(repr(device))")
    haskey(DTYPES, dtype) || error("--dtype must be float32 or float64, got $(repr(dtype))")
    repeats = repeats > 0 ? repeats : (quick ? 5 : 20)
    out = isempty(out) ? "crossfuse-julia-$(device).csv" : out
    return (; help, device, out, quick, T = DTYPES[dtype], repeats, warmup = quick ? 1 : 3)
end

const OPTIONS = parse_options(ARGS)

# CUDA.jl is loaded only for a GPU run, and only if it is installed.
if OPTIONS.device == "cuda" && !OPTIONS.help
    if Base.find_package("CUDA") === nothing
        error(
            "--device cuda needs CUDA.jl in this environment: " *
                "julia --project=. -e 'using Pkg; Pkg.add(\"CUDA\")'",
        )
    end
    using CUDA: CUDA
end

# The benchmark suite as data: (op, impl, constructor). A constructor takes the feature count N,
# the element type and the function that moves arrays to the device, and returns `x -> y`;
# affine parameters are random vectors of length N, bound in the closure.
const VARIANTS = (
    (op = "normalise", impl = "normal_now", make = (N, T, dev) -> normal_now),
    (op = "normalise", impl = "normal_new", make = (N, T, dev) -> normal_new),
    (op = "normalise", impl = "normal_newer", make = (N, T, dev) -> normal_newer),
    (
        op = "layer_norm",
        impl = "layernorm",
        make = function (N, T, dev)
            γ, β = dev(randn(T, N)), dev(randn(T, N))
            return x -> layernorm(x, γ, β)
        end,
    ),
    (
        op = "layer_norm_maxstd",
        impl = "layer_norm",
        make = function (N, T, dev)
            α, β = dev(randn(T, N)), dev(randn(T, N))
            return x -> layer_norm(α, β, x)
        end,
    ),
)

const QUICK_SHAPES = ((64, 32), (256, 128))
const FULL_SHAPES = ((100, 100), (100, 1000), (1000, 10000), (1024, 4096), (4096, 4096))

function device_mover(device::AbstractString)
    device == "cpu" && return identity
    CUDA.functional() ||
        error("CUDA.jl is installed but CUDA.functional() is false: no usable GPU")
    probe = CUDA.CuArray(zeros(Float32, 1))
    if !(CrossFuse.measure_backend(probe) isa CrossFuse.CUDAMeasure)
        error("CUDA.jl is loaded but CrossFuse's extension CrossFuseCUDAExt is not")
    end
    return CUDA.CuArray
end

function main(options)
    if options.help
        println(USAGE)
        return nothing
    end
    dev = device_mover(options.device)
    shapes = options.quick ? QUICK_SHAPES : FULL_SHAPES
    modes = ("fwd", "bwd", "fwd+bwd")
    total = length(VARIANTS) * length(shapes) * length(modes)
    rows = NamedTuple[]
    for (N, M) in shapes, variant in VARIANTS
        Random.seed!(N + M) # the same input and parameters for every variant of a shape
        x = dev(randn(options.T, N, M))
        f = variant.make(N, options.T, dev)
        for mode in modes
            kwargs = (; op = variant.op, impl = variant.impl, options.repeats, options.warmup)
            row = if mode == "fwd"
                measure_forward(f, x; kwargs...)
            else
                measure_gradient(Zygote.pullback, f, x; mode, kwargs...)
            end
            push!(rows, row)
            println(
                "[$(length(rows))/$total] $(row.impl) $(row.mode) $(row.shape) $(row.dtype) ",
                "$(row.device): p50 $(round(row.ms_p50; sigdigits = 4)) ms, ",
                "$(round(row.gbps; sigdigits = 4)) GB/s, $(row.alloc_bytes) bytes allocated, ",
                "relerr $(round(row.relerr; sigdigits = 3))",
            )
            flush(stdout)
        end
        GC.gc() # the arrays of this shape are garbage now
    end
    path = abspath(write_csv(options.out, rows))
    println("CSV written: ", path)
    return path
end

main(OPTIONS)
