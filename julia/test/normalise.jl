@testset "normalise: normal_now, normal_new, normal_newer" begin
    variants = (normal_now, normal_new, normal_newer)

    @testset "forward against the Float64 formula: $f, $T" for f in variants, T in (
            Float64,
            Float32,
        )
        tol = T == Float64 ? 1.0e-12 : 1.0e-5
        for dims in (1, 2, (1, 2), :)
            x = T.(2 .* randn(9, 6, 2) .+ 1)
            @test maxerr(f(x; dims), ref_normalise(x; dims, eps = Float64(eps(T)))) ≤ tol
            @test eltype(f(x; dims)) == T
        end
        x = T.(randn(8, 5))
        @test maxerr(f(x; eps = 1.0e-3), ref_normalise(x; dims = 1, eps = 1.0e-3)) ≤ tol
    end

    @testset "normal_now: Zygote gradient against finite differences" begin
        x = randn(5, 4)
        w = randn(5, 4)
        for dims in (1, 2)
            loss = x -> sum(w .* normal_now(x; dims))
            @test Zygote.gradient(loss, x)[1] ≈
                fd_gradient(loss, x)[1] rtol = 1.0e-7 atol = 1.0e-9
        end
    end

    @testset "rrule $f (Float64)" for f in (normal_new, normal_newer)
        test_rrule(f, randn(5, 4))
        test_rrule(f, randn(5, 4); fkwargs = (; dims = 2))
        test_rrule(f, randn(4, 3, 2); fkwargs = (; dims = (1, 2)))
        test_rrule(f, randn(5, 4); fkwargs = (; dims = 1, eps = 1.0e-3))
    end

    @testset "rrule $f: Zygote uses it, and the pullback leaves dy alone" for f in (
            normal_new,
            normal_newer,
        )
        x = randn(6, 3)
        dy = randn(6, 3)
        dy_before = copy(dy)
        y, back = rrule(f, x; dims = 2)
        dx = back(dy)[2]
        @test dy == dy_before # the one temporary is the pullback's own, not dy
        @test y ≈ ref_normalise(x; dims = 2, eps = eps(Float64))
        # Equal bit for bit: the same code computed both (through the rules for `mean`, `var` and
        # broadcasting instead, Zygote would round differently).
        y_z, back_z = Zygote.pullback(x -> f(x; dims = 2), x)
        @test y_z == y
        @test back_z(dy)[1] == dx
    end

    @testset "rrule $f, Float16: the pullback sums in Float32" for f in (
            normal_new,
            normal_newer,
        )
        # Σdy = 4096 * 100 is past Float16's range (65504): summed in Float16 it was Inf, and ∂x
        # Inf or NaN. Σy is 0 up to the rounding of μ, so ∂x of <100, y> is ~0 against its scale
        # istd * 100 ≈ 100 (the Float64 rule on the same numbers gives ~1e-12).
        x = Float16.(randn(4096, 1))
        y, back = rrule(f, x)
        dx = back(fill(Float16(100), 4096, 1))[2]
        dx64 = rrule(f, Float64.(x))[2](fill(100.0, 4096, 1))[2]
        @test eltype(y) == Float16
        @test eltype(dx) == Float16
        @test all(isfinite, dx)
        @test maxerr(dx, dx64) ≤ 1.0
        # and a plain case against the Float64 rule on the same numbers
        x2 = Float16.(randn(9, 4))
        dy2 = Float16.(randn(9, 4))
        dx16 = rrule(f, x2)[2](dy2)[2]
        dx2_64 = rrule(f, Float64.(x2))[2](Float64.(dy2))[2]
        @test maxerr(dx16, dx2_64) ≤ 2.0e-2 * maximum(abs, dx2_64)
    end

    @testset "Float16: statistics in Float32, output in Float16: $f" for f in variants
        ε16 = Float64(eps(Float16))
        # 4096 values near 16 in a column: Σx ≈ 65536 is past Float16's largest value (65504).
        # Summed in Float16, as Statistics.mean does, μ was Inf and y NaN.
        x = Float16.(16 .+ randn(4096, 2))
        y = f(x)
        @test eltype(y) == Float16
        @test all(isfinite, y)
        @test maxerr(y, ref_normalise(x; dims = 1, eps = ε16)) ≤ 1.0e-2
        # A spread of 8 over 2048 values: Σ(x - μ)² ≈ 1.3e5, past 65504; in Float16 σ² was Inf
        # and y all zeros.
        xs = Float16.(8 .* randn(2048, 2))
        @test maxerr(f(xs), ref_normalise(xs; dims = 1, eps = ε16)) ≤ 1.0e-2
        # Zygote's gradient in Float16 (through the rule, or through mean, var and the widening)
        # against the Float64 gradient on the same numbers.
        dy = Float16.(randn(2048, 2))
        dx = Zygote.pullback(f, xs)[2](dy)[1]
        dx64 = Zygote.pullback(x -> f(x; eps = ε16), Float64.(xs))[2](Float64.(dy))[1]
        @test eltype(dx) == Float16
        @test maxerr(dx, dx64) ≤ 2.0e-2 * maximum(abs, dx64)
    end

    @testset "edge cases: $f" for f in variants
        w1 = randn(1, 6)
        # One feature: each slice holds one element, so x - μ == 0 exactly and y == 0.
        x1 = randn(1, 6)
        @test all(iszero, f(x1))
        g1 = Zygote.gradient(x -> sum(w1 .* f(x)), x1)[1]
        @test maximum(abs, g1) ≤ 1.0e-12 # y is 0 whatever x is: its gradient is 0

        # One column.
        xc = randn(8, 1)
        @test maxerr(f(xc), ref_normalise(xc; dims = 1, eps = eps(Float64))) ≤ 1.0e-12

        # All values of a slice equal: zero variance. The output is x - μ (a rounding error of
        # the mean, ~1e-16 |x|) amplified by 1 / sqrt(eps) ≈ 7e7: finite and tiny.
        xe = repeat([0.1 -3.0 7.5], 5, 1)
        ye = f(xe)
        @test all(isfinite, ye)
        @test maximum(abs, ye) ≤ 1.0e-6
        # The gradient is istd (dy - mean(dy)) with istd = 1 / sqrt(eps): the term in y istd Σ(dy (x - μ))
        # is ~1e-26 of it.
        we = randn(5, 3)
        ge = Zygote.gradient(x -> sum(we .* f(x)), xe)[1]
        @test isapprox(ge, (we .- mean(we; dims = 1)) ./ sqrt(eps(Float64)); rtol = 1.0e-10)
    end
end
