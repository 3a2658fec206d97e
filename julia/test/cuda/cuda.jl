# The CUDA tests, included by runtests.jl of this environment. Asked for explicitly
# (`make julia-test-cuda`), so a GPU that CUDA.jl cannot use is a failure, not a skip.

@testset "CUDA" begin
    @test CUDA.functional()
    if CUDA.functional()
        x = randn(Float32, 257, 33)
        x64 = Float64.(x)
        xc = CUDA.CuArray(x)

        @testset "the extension measures CuArrays" begin
            @test CrossFuse.measure_backend(xc) isa CrossFuse.CUDAMeasure
            row = measure_forward(
                normal_newer,
                xc;
                op = "normalise",
                impl = "normal_newer",
                repeats = 3,
                warmup = 1,
            )
            @test keys(row) == CrossFuse.RESULT_FIELDS
            @test row.device == "cuda"
            @test occursin("CUDA=", row.versions)
            @test row.alloc_bytes > 0
            @test 0 < row.ms_p20 ≤ row.ms_p50 ≤ row.ms_p80
            g = measure_gradient(
                Zygote.pullback,
                normal_newer,
                xc;
                op = "normalise",
                impl = "normal_newer",
                repeats = 3,
                warmup = 1,
            )
            @test g.device == "cuda"
            @test g.relerr < 1.0e-3
        end

        @testset "mean_var, normal_newer and layer_norm on a CuArray" begin
            for dims in (1, 2)
                s = mean_var(xc; dims)
                @test s.mean isa CUDA.CuArray{Float32}
                @test maxerr(s.mean, mean(x64; dims)) ≤ 1.0e-5
                @test maxerr(s.var, var(x64; dims, corrected = false)) ≤ 1.0e-4
                @test maxerr(
                    normal_newer(xc; dims),
                    ref_normalise(x; dims, eps = Float64(eps(Float32))),
                ) ≤
                    1.0e-4
                dy = randn(Float32, size(x))
                _, back_g = rrule(normal_newer, xc; dims)
                _, back_c = rrule(normal_newer, x64; dims)
                dx_c = back_c(Float64.(dy))[2]
                @test maxerr(back_g(CUDA.CuArray(dy))[2], dx_c) ≤
                    1.0e-3 * maximum(abs, dx_c)
            end
            α, β = randn(Float32, 257), randn(Float32, 257)
            yc = layer_norm(CUDA.CuArray(α), CUDA.CuArray(β), xc)
            @test maxerr(yc, ref_maxstd(1.0e-5, α, β, x)) ≤ 1.0e-4
        end
    end
end
