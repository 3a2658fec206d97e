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
        # Equal bit for bit: the same code computed both. Through the rules for `sum`, `abs2` and
        # broadcasting instead, Zygote would round differently, and these would fail.
        @test zα == ChainRulesCore.unthunk(∂α)
        @test zβ == ChainRulesCore.unthunk(∂β)
        @test zx == ChainRulesCore.unthunk(∂x)
    end

    @testset "a sum loss (Zygote's Fill cotangent), alpha = $(repr(a))" for a in (
            nothing,
            2.0,
        )
        # Zygote's own rule for `sum` passes a FillArrays `Fill` as Ȳ, and Fill .* a number is a
        # Fill: the pullback must not write into it. The sum of each normalised column is 0 whatever
        # x is, so the gradient is 0 up to rounding.
        x = 3 .* randn(6, 4) .+ 1
        g = Zygote.gradient(x -> sum(layer_norm(a, nothing, x)), x)[1]
        @test g isa Matrix{Float64}
        @test maximum(abs, g) ≤ 1.0e-10
    end

    @testset "y has eltype(x), whatever the types of alpha and beta" begin
        x32 = randn(Float32, 7, 4)
        @test eltype(layer_norm(1.0, 0.0, x32)) == Float32
        @test eltype(layer_norm(randn(7), randn(7), x32)) == Float32
        y, back = rrule(layer_norm, 1.0, nothing, x32)
        @test eltype(y) == Float32
        @test eltype(ChainRulesCore.unthunk(back(randn(Float32, 7, 4))[4])) == Float32
    end

    @testset "Float16: statistics in Float32, output in Float16" begin
        x = Float16.(3 .* randn(7, 4) .+ 1)
        α = Float16.(randn(7))
        β = Float16.(randn(7))
        y = layer_norm(α, β, x)
        @test eltype(y) == Float16
        @test maxerr(y, ref_maxstd(1.0e-5, α, β, x)) ≤ 2.0e-2
        # The gradients against the Float64 rule on the same numbers.
        dy = Float16.(randn(7, 4))
        _, back16 = rrule(layer_norm, α, β, x)
        _, back64 = rrule(layer_norm, Float64.(α), Float64.(β), Float64.(x))
        for (g, c) in zip(back16(dy)[2:4], back64(Float64.(dy))[2:4])
            g16 = ChainRulesCore.unthunk(g)
            cc = ChainRulesCore.unthunk(c)
            @test eltype(g16) == Float16
            @test maxerr(g16, cc) ≤ 2.0e-2 * maximum(abs, cc)
        end
        # Constant columns (N a power of 2, so μ == x exactly): σ = 0 < ϵ, and n = 0 / ϵ = 0. In
        # Float16 arithmetic 1 / ϵ overflowed to Inf and gave 0 * Inf = NaN.
        xe = Float16.(repeat([0.1 -3.0 7.5], 8, 1))
        # (Its ∂x, (g - mean(g)) / ϵ, is ~1e5: past Float16's range, as the true value is.)
        @test all(iszero, layer_norm(nothing, nothing, xe))
        # One feature: y == β exactly.
        x1 = Float16.(randn(1, 5))
        @test layer_norm(nothing, Float16[0.25], x1) == fill(Float16(0.25), 1, 5)
        # ∂β summed in Float32: dy = 1 over 70000 columns sums past Float16's range, which a
        # Float32 β holds.
        xw = Float16.(randn(2, 70000))
        _, backw = rrule(layer_norm, nothing, randn(Float32, 2), xw)
        @test ChainRulesCore.unthunk(backw(ones(Float16, 2, 70000))[3]) ==
            fill(70000.0f0, 2)
        # Ȳ α widened before the product: Ȳ = α = 300 gives g = 9e4, past Float16's range (in
        # Float16 it was Inf, and ∂x Inf - Inf = NaN). A constant g has ∂x = 0 up to rounding.
        α3 = fill(Float16(300), 6)
        x3 = Float16.(randn(6, 4))
        _, back3 = rrule(layer_norm, α3, nothing, x3)
        _, back3_64 = rrule(layer_norm, Float64.(α3), nothing, Float64.(x3))
        dx3 = ChainRulesCore.unthunk(back3(fill(Float16(300), 6, 4))[4])
        dx3_64 = ChainRulesCore.unthunk(back3_64(fill(300.0, 6, 4))[4])
        @test eltype(dx3) == Float16
        @test all(isfinite, dx3)
        @test maxerr(dx3, dx3_64) ≤ 1.0 # against a scale of g / σ ≈ 9e4
        # Long columns: Σx² ≈ 8192 * 20 is past Float16's largest value (65504).
        xl = Float16.(4 .* randn(8192, 2) .+ 2)
        @test maxerr(
            layer_norm(nothing, nothing, xl),
            ref_maxstd(1.0e-5, nothing, nothing, xl),
        ) ≤
            1.0e-2
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
        dye = randn(5, 3)
        # the floor is active: ∂x = (g - mean(g)) / ϵ, g = dy here (no α)
        @test isapprox(
            backe(dye)[4],
            (dye .- mean(dye; dims = 1)) ./ 1.0e-5;
            rtol = 1.0e-10,
        )
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
