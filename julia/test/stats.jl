@testset "stats" begin
    @testset "sum_length" begin
        x = randn(3, 4, 5)
        @test CrossFuse.sum_length(x, 2) == 4
        @test CrossFuse.sum_length(x, :) == 60
        @test CrossFuse.sum_length(x, (1, 3)) == 15
        @test CrossFuse.sum_length(x, [2, 3]) == 20
        @test CrossFuse.sum_length(x, (1, 1)) == 3 # a repeated dimension counts once
    end

    @testset "mean_var, generic method, dims = $dims" for dims in (1, 2, (1, 2), :)
        x = randn(7, 5, 3) .+ 3
        s = mean_var(x; dims)
        @test keys(s) == (:mean, :var)
        @test s.mean ≈ mean(x; dims)
        @test s.var ≈ var(x; dims, corrected = false)
        @test mean_var(x; dims, corrected = true).var ≈ var(x; dims, corrected = true)
        if dims !== (:)
            @test size(s.mean) == size(sum(x; dims)) # the reduced shape, size 1 along dims
            @test size(s.var) == size(s.mean)
        end
    end

    @testset "mean_var, Float16: the statistics in Float32" begin
        # 4096 values near 16: Σx ≈ 65536 overflows Float16 (largest 65504); summed in Float16,
        # as Statistics.mean does, the mean was Inf.
        x = Float16.(16 .+ randn(4096, 2))
        s = mean_var(x; dims = 1)
        x64 = Float64.(x)
        @test eltype(s.mean) == Float32
        @test eltype(s.var) == Float32
        @test maxerr(s.mean, mean(x64; dims = 1)) ≤ 1.0e-4
        @test maxerr(s.var, var(x64; dims = 1, corrected = false)) ≤ 1.0e-3
        @test CrossFuse.widen_stats(x) isa Matrix{Float32}
        x32 = randn(Float32, 3, 2)
        @test CrossFuse.widen_stats(x32) === x32 # no copy where nothing is widened
        @test CrossFuse.narrow_like(x32, x32) === x32
        @test CrossFuse.narrow_like(x, Float32.(x)) isa Matrix{Float16}
    end

    @testset "rrule mean_var (Float64)" begin
        # The output is a NamedTuple, whose cotangent arrives as a Tangent; inference of the
        # pullback through that Tangent is not what is tested here.
        test_rrule(mean_var, randn(4, 3); fkwargs = (; dims = 1), check_inferred = false)
        test_rrule(
            mean_var,
            randn(4, 3);
            fkwargs = (; dims = 2, corrected = true),
            check_inferred = false,
        )
        test_rrule(
            mean_var,
            randn(3, 2, 4);
            fkwargs = (; dims = (1, 3)),
            check_inferred = false,
        )
    end
end
