"""
    CrossFuseCUDAExt

Loaded when CUDA.jl is loaded next to CrossFuse. It holds only what the generic GPUArrays code
cannot do: measuring calls on a `CuArray` with CUDA's own tools. The normalisation code itself
runs on a `CuArray` through its `AbstractGPUArray` methods, without this extension.
"""
module CrossFuseCUDAExt

using CrossFuse: CrossFuse, CUDAMeasure
using CUDA: CUDA, CuArray

CrossFuse.measure_backend(::CuArray) = CUDAMeasure()

CrossFuse.device_label(::CUDAMeasure) = "cuda"
CrossFuse.device_name(::CUDAMeasure) = CUDA.name(CUDA.device())
CrossFuse.backend_versions(::CUDAMeasure) = "CUDA=$(Base.pkgversion(CUDA))"
CrossFuse.synchronize_backend(::CUDAMeasure) = CUDA.synchronize()

# `CUDA.@elapsed` records events around the call on the current stream and returns the seconds
# between them; it assumes the GPU is idle when it starts, hence the synchronisation.
function CrossFuse.time_one(::CUDAMeasure, run)
    CUDA.synchronize()
    return Float64(CUDA.@elapsed run())
end

# `CUDA.@allocated` counts the bytes CUDA.jl's allocator hands out during the call (a total,
# not a peak; memory that CUDA.jl did not allocate, such as DLPack-wrapped arrays, is not seen).
function CrossFuse.bytes_one(::CUDAMeasure, run)
    CUDA.synchronize()
    bytes = CUDA.@allocated run()
    CUDA.synchronize()
    return bytes
end

end # module CrossFuseCUDAExt
