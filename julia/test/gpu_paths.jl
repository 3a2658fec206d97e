# The AbstractGPUArray methods (`GPUArray` here), run without a GPU on JLArrays, the CPU-backed
# AbstractGPUArray of GPUArrays.jl, and compared against the CPU results.

@testset "GPU code paths on JLArray" begin
    # 33 rows: not a power of two, so some threads of a GPU-style reduction start empty and the
    # combine step meets its `init`.
    x = randn(Float32, 33, 7)
    xg = JLArray(x)
    x64 = Float64.(x)

    @testset "dispatch reaches the AbstractGPUArray methods" begin
        @test xg isa GPUArray{Float32}
        gpu_mean_var = which(mean_var, Tuple{GPUArray{Float32, 2}})
        @test which(mean_var, Tuple{typeof(xg)}) === gpu_mean_var
        @test which(mean_var, Tuple{Matrix{Float32}}) !== gpu_mean_var
        @test which(normal_newer, Tuple{typeof(xg)}) ===
            which(normal_newer, Tuple{GPUArray})
        @test which(rrule, Tuple{typeof(normal_newer), typeof(xg)}) ===
            which(rrule, Tuple{typeof(normal_newer), GPUArray})
        @test which(rrule, Tuple{typeof(normal_newer), Matrix{Float32}}) !==
            which(rrule, Tuple{typeof(normal_newer), GPUArray})
    end

    @testset "mean_var, one-pass Float32 method, dims = $dims" for dims in (1, 2, (1, 2))
        s = mean_var(xg; dims)
        ref = mean_var(x64; dims)
        @test s.mean isa JLArray{Float32}
        @test s.var isa JLArray{Float32}
        @test size(s.mean) == size(ref.mean)
        @test maxerr(s.mean, ref.mean) ≤ 1.0e-5
        @test maxerr(s.var, ref.var) ≤ 1.0e-4
        @test maxerr(
            mean_var(xg; dims, corrected = true).var,
            mean_var(x64; dims, corrected = true).var,
        ) ≤
            1.0e-4
    end

    @testset "mean_var over all dims gives scalars" begin
        s = mean_var(xg; dims = :)
        @test s.mean isa Float32
        @test abs(s.mean - mean(x64)) ≤ 1.0e-5
        @test abs(s.var - var(x64; corrected = false)) ≤ 1.0e-4
    end

    @testset "mean_var, one-pass method, large mean" begin
        # Welford/Chan works with deviations from running means, so a large mean costs little.
        xl = 1.0f4 .+ randn(Float32, 64, 16)
        s = mean_var(JLArray(xl); dims = 1)
        @test maxerr(s.var, var(Float64.(xl); dims = 1, corrected = false)) ≤ 1.0e-2
    end

    @testset "mean_var, one-pass method, means past sqrt(floatmax(Float32))" begin
        # Combining with the empty triple (the reduction's `init`) returns the other side as it is;
        # through the formula δ² overflowed for |m| > 1.8e19 and Inf * 0 made the variance NaN.
        t = (2.0f19, 0.0f0, Int64(1))
        @test CrossFuse._chan_combine(CrossFuse._WELFORD_EMPTY, t) === t
        @test CrossFuse._chan_combine(t, CrossFuse._WELFORD_EMPTY) === t
        s = mean_var(JLArray(fill(2.0f19, 8, 3)); dims = 1)
        @test Array(s.mean) == fill(2.0f19, 1, 3)
        @test Array(s.var) == zeros(Float32, 1, 3)
    end

    @testset "mean_var, one-pass method: the count does not wrap past 2^31" begin
        # Two groups of 2^31 - 1 elements each: their count, 2^32 - 2, is past typemax(Int32), so
        # an Int32 count wrapped to -2 (a negative weight, and a mean far off).
        k = Int64(typemax(Int32))
        a = (1.0f0, 0.0f0, k)
        b = (3.0f0, 0.0f0, k)
        m, s, n = CrossFuse._chan_combine(a, b)
        @test n == 2k
        @test n isa Int64
        @test m == 2.0f0
        @test s ≈ 2 * Float32(k) # two groups a distance 2 apart: M2 = 2² k k / 2k = 2k
        @test CrossFuse._WELFORD_EMPTY[3] isa Int64
        @test CrossFuse._welford_leaf(1.0f0)[3] isa Int64
    end

    @testset "rrule mean_var on the GPU path" begin
        Δμ = randn(Float32, 1, 7)
        Δσ² = randn(Float32, 1, 7)
        _, back_g = rrule(mean_var, xg; dims = 1)
        _, back_c = rrule(mean_var, x64; dims = 1)
        ∂g = back_g((; mean = JLArray(Δμ), var = JLArray(Δσ²)))[2]
        ∂c = back_c((; mean = Float64.(Δμ), var = Float64.(Δσ²)))[2]
        @test ∂g isa JLArray
        @test maxerr(∂g, ∂c) ≤ 1.0e-4 * maximum(abs, ∂c)
    end

    @testset "normal_newer and its rule, dims = $dims" for dims in (1, 2)
        yg = normal_newer(xg; dims)
        @test yg isa JLArray{Float32}
        @test maxerr(yg, ref_normalise(x; dims, eps = Float64(eps(Float32)))) ≤ 1.0e-4
        @test maxerr(yg, normal_newer(x; dims)) ≤ 1.0e-4

        dy = randn(Float32, size(x))
        _, back_g = rrule(normal_newer, xg; dims)
        _, back_c = rrule(normal_newer, x64; dims)
        dx_g = back_g(JLArray(dy))[2]
        dx_c = back_c(Float64.(dy))[2]
        @test dx_g isa JLArray{Float32}
        @test maxerr(dx_g, dx_c) ≤ 1.0e-3 * maximum(abs, dx_c)

        # In Float64 the GPU path (generic mean_var, the pullback written with divisions) and the
        # CPU path (the pullback written with istd) agree to rounding.
        xg64 = JLArray(x64)
        _, back_g64 = rrule(normal_newer, xg64; dims)
        @test maxerr(normal_newer(xg64; dims), normal_newer(x64; dims)) ≤ 1.0e-12
        @test maxerr(back_g64(JLArray(Float64.(dy)))[2], dx_c) ≤
            1.0e-10 * maximum(abs, dx_c)

        # Zygote goes through the same rule: the same gradient, bit for bit.
        _, back_z = Zygote.pullback(x -> normal_newer(x; dims), xg)
        dx_z = back_z(JLArray(dy))[1]
        @test maxerr(dx_z, dx_c) ≤ 1.0e-3 * maximum(abs, dx_c)
        @test Array(dx_z) == Array(dx_g)
    end

    @testset "layer_norm on JLArray" begin
        α = randn(Float32, 33)
        β = randn(Float32, 33)
        αg, βg = JLArray(α), JLArray(β)
        yg = layer_norm(αg, βg, xg)
        @test yg isa JLArray{Float32}
        @test maxerr(yg, ref_maxstd(1.0e-5, α, β, x)) ≤ 1.0e-4
        dy = randn(Float32, size(x))
        _, back_g = rrule(layer_norm, αg, βg, xg)
        _, back_c = rrule(layer_norm, Float64.(α), Float64.(β), x64)
        for (g, c) in zip(back_g(JLArray(dy))[2:4], back_c(Float64.(dy))[2:4])
            cc = ChainRulesCore.unthunk(c)
            @test maxerr(ChainRulesCore.unthunk(g), cc) ≤ 1.0e-3 * maximum(abs, cc)
        end
    end
end
