@testset "layernorm (op layer_norm, torch's convention)" begin
    @testset "forward against the Float64 formula, $T" for T in (Float64, Float32)
        tol = T == Float64 ? 1.0e-12 : 1.0e-5
        x = T.(3 .* randn(6, 5) .+ 2)
        γ = T.(randn(6))
        β = T.(randn(6))
        @test maxerr(layernorm(x), ref_layernorm(x, nothing, nothing)) ≤ tol
        @test maxerr(layernorm(x, γ, β), ref_layernorm(x, γ, β)) ≤ tol
        # scale and bias are optional independently of each other
        @test maxerr(layernorm(x, γ), ref_layernorm(x, γ, nothing)) ≤ tol
        @test maxerr(layernorm(x, nothing, β), ref_layernorm(x, nothing, β)) ≤ tol
        @test eltype(layernorm(x, γ, β)) == T
        # other dims: γ and β have the size of the normalised dimensions
        γ2, β2 = T.(randn(5)), T.(randn(5))
        @test maxerr(layernorm(x, γ2, β2; dims = 2), ref_layernorm(x, γ2, β2; dims = 2)) ≤
            tol
        x3 = T.(randn(4, 3, 2))
        γ3, β3 = T.(randn(4, 3)), T.(randn(4, 3))
        @test maxerr(
            layernorm(x3, γ3, β3; dims = (1, 2)),
            ref_layernorm(x3, γ3, β3; dims = (1, 2)),
        ) ≤
            tol
        @test maxerr(
            layernorm(x; eps = 0.1),
            ref_layernorm(x, nothing, nothing; eps = 0.1),
        ) ≤
            tol
    end

    @testset "a scale of the wrong size is a DimensionMismatch" begin
        @test_throws DimensionMismatch layernorm(randn(6, 5), randn(5))
        @test_throws DimensionMismatch layernorm(randn(6, 5), nothing, randn(7))
    end

    @testset "Zygote gradients (x, scale, bias) against finite differences" begin
        x = randn(6, 4)
        γ = randn(6)
        β = randn(6)
        w = randn(6, 4)
        loss = (x, γ, β) -> sum(w .* layernorm(x, γ, β))
        for (ad, fd) in zip(Zygote.gradient(loss, x, γ, β), fd_gradient(loss, x, γ, β))
            @test ad ≈ fd rtol = 1.0e-7 atol = 1.0e-9
        end
        loss2 = x -> sum(w' .* layernorm(x', nothing, nothing; dims = 2))
        @test Zygote.gradient(loss2, x)[1] ≈
            fd_gradient(loss2, x)[1] rtol = 1.0e-7 atol = 1.0e-9
    end

    @testset "Float16: statistics in Float32, output in Float16" begin
        # 4096 features near 16: Σx ≈ 65536 is past Float16's largest value (65504). Summed in
        # Float16, as Statistics.mean does, μ was Inf and y NaN.
        x = Float16.(16 .+ randn(4096, 3))
        γ, β = Float16.(randn(4096)), Float16.(randn(4096))
        y = layernorm(x, γ, β)
        @test eltype(y) == Float16
        @test all(isfinite, y)
        @test maxerr(y, ref_layernorm(x, γ, β)) ≤ 2.0e-2
        # Zygote's gradients in Float16 against the Float64 ones on the same numbers.
        xs = Float16.(8 .* randn(64, 5))
        γs, βs = Float16.(randn(64)), Float16.(randn(64))
        dy = Float16.(randn(64, 5))
        g16 = Zygote.pullback(layernorm, xs, γs, βs)[2](dy)
        g64 = Zygote.pullback(layernorm, Float64.(xs), Float64.(γs), Float64.(βs))[2](
            Float64.(dy),
        )
        for (a, b) in zip(g16, g64)
            @test eltype(a) == Float16
            @test maxerr(a, b) ≤ 2.0e-2 * maximum(abs, b)
        end
    end

    @testset "edge cases" begin
        # One feature: x - μ == 0 exactly, so the output is the bias.
        x1 = randn(1, 5)
        β1 = randn(1)
        @test layernorm(x1, randn(1), β1) == repeat(β1, 1, 5)
        # the output is the bias whatever x is: its gradient is 0
        g1 = Zygote.gradient(x -> sum(abs2, layernorm(x, [2.0], [0.5])), x1)[1]
        @test maximum(abs, g1) ≤ 1.0e-12
        # Zero variance: the output is a rounding error of the mean over sqrt(eps), and the gradient
        # (dy - mean(dy)) / sqrt(eps) (the term in y is ~1e-22 of it).
        xe = fill(4.2, 6, 3)
        @test maximum(abs, layernorm(xe)) ≤ 1.0e-10
        we = randn(6, 3)
        ge = Zygote.gradient(x -> sum(we .* layernorm(x)), xe)[1]
        @test isapprox(ge, (we .- mean(we; dims = 1)) ./ sqrt(1.0e-5); rtol = 1.0e-10)
    end
end
