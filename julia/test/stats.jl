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
