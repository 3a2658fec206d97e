@testset "layer_norm (op layer_norm_maxstd, α (x - μ) / max(σ, ϵ) + β)" begin
    @testset "forward against the Float64 formula, $T" for T in (Float64, Float32)
        tol = T == Float64 ? 1.0e-12 : 1.0e-5
        x = T.(3 .* randn(7, 4) .+ 1)
        α = T.(randn(7))
        β = T.(randn(7))
        @test maxerr(layer_norm(α, β, x), ref_maxstd(1.0e-5, α, β, x)) ≤ tol
        @test maxerr(
            layer_norm(nothing, nothing, x),
            ref_maxstd(1.0e-5, nothing, nothing, x),
        ) ≤
            tol
        @test maxerr(layer_norm(1.0e-3, α, nothing, x), ref_maxstd(1.0e-3, α, nothing, x)) ≤
            tol
        @test maxerr(layer_norm(nothing, β, x), ref_maxstd(1.0e-5, nothing, β, x)) ≤ tol
        @test maxerr(layer_norm(T(2), T(-1), x), ref_maxstd(1.0e-5, 2.0, -1.0, x)) ≤ 2 * tol
        @test eltype(layer_norm(α, β, x)) == T
        # The seed's spelling of "no affine part": true and false act as 1 and 0.
        @test layer_norm(true, false, x) == layer_norm(nothing, nothing, x)
        # Further dimensions are independent columns.
        x3 = T.(randn(5, 3, 2))
        α3 = T.(randn(5))
        @test maxerr(layer_norm(α3, nothing, x3), ref_maxstd(1.0e-5, α3, nothing, x3)) ≤ tol
    end

    @testset "the eps convention is max(σ, ϵ), not sqrt(σ² + ϵ)" begin
        xs = 1.0e-4 .* randn(7, 4) # σ ≈ 1e-4, below ϵ = 1e-2
        @test layer_norm(1.0e-2, nothing, nothing, xs) ≈
            (xs .- mean(xs; dims = 1)) ./ 1.0e-2
        xb = randn(7, 4) # σ ≈ 1, far above ϵ
        σb = sqrt.(var(xb; dims = 1, corrected = false))
        @test layer_norm(1.0e-2, nothing, nothing, xb) ≈ (xb .- mean(xb; dims = 1)) ./ σb
    end

    @testset "bad alpha or beta" begin
        x = randn(6, 3)
        @test_throws DimensionMismatch layer_norm(randn(5), nothing, x)
        @test_throws DimensionMismatch layer_norm(nothing, randn(7), x)
        @test_throws ArgumentError layer_norm(randn(6, 1), nothing, x)
    end

    @testset "rrule (Float64), alpha = $(typeof(α)), beta = $(typeof(β))" for (α, β) in (
            (randn(6), randn(6)),
            (nothing, nothing),
            (randn(6), nothing),
            (nothing, randn(6)),
            (1.5, -0.5),
        )
        x = randn(6, 4)
        test_rrule(layer_norm, 1.0e-5 ⊢ NoTangent(), α, β, x)
        test_rrule(layer_norm, α, β, x)
    end

    @testset "rrule where the floor is active: ∂x = (g - mean(g)) / ϵ" begin
        xs = 1.0e-3 .* randn(6, 4) # σ ≈ 1e-3 < ϵ = 0.1
        test_rrule(layer_norm, 0.1 ⊢ NoTangent(), randn(6), nothing, xs)
        g = randn(6, 4)
        _, back = rrule(layer_norm, 0.1, nothing, nothing, xs)
        @test back(g)[5] ≈ (g .- mean(g; dims = 1)) ./ 0.1
    end

    @testset "rrule on a 3-d input" begin
        test_rrule(layer_norm, randn(5), randn(5), randn(5, 3, 2))
    end

    @testset "Zygote uses the rule" begin
        x = randn(6, 4)
        α = randn(6)
        β = randn(6)
        dy = randn(6, 4)
        _, back = rrule(layer_norm, α, β, x)
        _, ∂α, ∂β, ∂x = back(dy)
        _, back_z = Zygote.pullback(layer_norm, α, β, x)
        zα, zβ, zx = back_z(dy)
        @test zα ≈ ChainRulesCore.unthunk(∂α)
        @test zβ ≈ ChainRulesCore.unthunk(∂β)
        @test zx ≈ ChainRulesCore.unthunk(∂x)
    end

    @testset "edge cases" begin
        # One feature: σ = 0 < ϵ and x - μ == 0, so y == β and ∂x == 0.
        x1 = randn(1, 5)
        @test layer_norm(nothing, [0.25], x1) == fill(0.25, 1, 5)
        _, back1 = rrule(layer_norm, nothing, nothing, x1)
        @test all(iszero, back1(randn(1, 5))[4])
        # One column, and a vector.
        xc = randn(8, 1)
        @test maxerr(
            layer_norm(nothing, nothing, xc),
            ref_maxstd(1.0e-5, nothing, nothing, xc),
        ) ≤
            1.0e-12
        xv = randn(8)
        @test maxerr(
            layer_norm(nothing, nothing, xv),
            ref_maxstd(1.0e-5, nothing, nothing, xv),
        ) ≤
            1.0e-12
        # Zero variance: the floor keeps the output finite (here exactly (x - μ) / ϵ ≈ 0).
        xe = repeat([0.1 -3.0 7.5], 5, 1)
        @test all(isfinite, layer_norm(nothing, nothing, xe))
        _, backe = rrule(layer_norm, nothing, nothing, xe)
        @test all(isfinite, backe(randn(5, 3))[4])
    end

    @testset "large mean: the single pass loses precision in Float32" begin
        # x = 1e4 + randn: mean² / variance ≈ 1e8, and s₂/N - μ² cancels that away. The tested
        # limit is the rounding bound of the single pass: |σ̂² - σ²| ≤ 3 (N + 2) eps(T) mean(x²)
        # per column. In Float32 that is ≈ 1.2e3 against a true variance ≈ 1: no digit of σ is
        # promised, only a finite output. In Float64 the same bound is ≈ 4e-6: fine.
        N = 64
        x = 1.0f4 .+ randn(Float32, N, 16)
        x64 = Float64.(x) # the same numbers, exactly
        truevar = var(x64; dims = 1, corrected = false)
        for (data, T) in ((x, Float32), (x64, Float64))
            _, σ₀ = CrossFuse._maxstd_stats(data)
            bound = 3 .* (N + 2) .* eps(T) .* mean(abs2, x64; dims = 1)
            @test all(abs.(Float64.(σ₀).^2 .- truevar) .≤ bound)
        end
        @test all(isfinite, layer_norm(nothing, nothing, x))
        @test maxerr(
            layer_norm(nothing, nothing, x64),
            ref_maxstd(1.0e-5, nothing, nothing, x64),
        ) ≤
            1.0e-4
        # The two-pass statistics of normal_newer keep Float32 usable on the same data: x - μ is
        # exact, and only the rounding of the mean remains (a Float32 sum of 64 values near 1e4
        # is off by a few 1e-3 after division by N, by 3e-2 at worst), against σ ≈ 1.
        @test maxerr(
            normal_newer(x),
            ref_normalise(x64; dims = 1, eps = Float64(eps(Float32))),
        ) ≤
            5.0e-2
    end
end
