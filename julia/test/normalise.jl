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

    @testset "edge cases: $f" for f in variants
        w1 = randn(1, 6)
        # One feature: each slice holds one element, so x - μ == 0 exactly and y == 0.
        x1 = randn(1, 6)
        @test all(iszero, f(x1))
        g1 = Zygote.gradient(x -> sum(w1 .* f(x)), x1)[1]
        @test all(isfinite, g1)

        # One column.
        xc = randn(8, 1)
        @test maxerr(f(xc), ref_normalise(xc; dims = 1, eps = eps(Float64))) ≤ 1.0e-12

        # All values of a slice equal: zero variance. The output is x - μ (a rounding error of
        # the mean, ~1e-16 |x|) amplified by 1 / sqrt(eps) ≈ 7e7: finite and tiny.
        xe = repeat([0.1 -3.0 7.5], 5, 1)
        ye = f(xe)
        @test all(isfinite, ye)
        @test maximum(abs, ye) ≤ 1.0e-6
        we = randn(5, 3)
        ge = Zygote.gradient(x -> sum(we .* f(x)), xe)[1]
        @test all(isfinite, ge)
    end
end
