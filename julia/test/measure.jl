@testset "measurement helpers" begin
    x = randn(Float32, 16, 8)

    @testset "measure_forward returns a row of the shared schema" begin
        row = measure_forward(
            normal_new,
            x;
            op = "normalise",
            impl = "normal_new",
            repeats = 3,
            warmup = 1,
        )
        @test keys(row) == CrossFuse.RESULT_FIELDS
        @test row.op == "normalise"
        @test row.impl == "normal_new"
        @test row.side == "julia"
        @test row.peer === false
        @test row.device == "cpu"
        @test !isempty(row.device_name)
        @test row.dtype == "float32"
        @test row.shape == "8x16" # torch's (M, N) for a Julia N×M array
        @test ismissing(row.causal)
        @test row.mode == "fwd"
        @test 0 < row.ms_p20 ≤ row.ms_p50 ≤ row.ms_p80
        @test row.gbps > 0
        @test ismissing(row.tflops)
        @test row.alloc_bytes > 0 # at least the output array
        @test ismissing(row.peak_bytes)
        @test 0 ≤ row.relerr < 1.0e-5
        @test occursin("julia=", row.versions) && occursin("CrossFuse=", row.versions)
        @test occursin(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", row.timestamp)
    end

    @testset "measure_gradient, mode = $mode" for mode in ("bwd", "fwd+bwd")
        for (impl, f) in (("normal_new", normal_new), ("normal_now", normal_now))
            row = measure_gradient(
                Zygote.pullback,
                f,
                x;
                op = "normalise",
                impl,
                mode,
                repeats = 3,
                warmup = 1,
            )
            @test keys(row) == CrossFuse.RESULT_FIELDS
            @test row.mode == mode
            @test row.impl == impl
            @test 0 < row.ms_p20 ≤ row.ms_p50 ≤ row.ms_p80
            @test row.alloc_bytes > 0
            @test 0 ≤ row.relerr < 1.0e-4
            @test occursin("Zygote=", row.versions)
        end
    end

    @testset "closures bind the other arguments" begin
        α, β = randn(Float32, 16), randn(Float32, 16)
        row = measure_forward(
            x -> layer_norm(α, β, x),
            x;
            op = "layer_norm_maxstd",
            impl = "layer_norm",
            repeats = 2,
            warmup = 1,
        )
        @test row.op == "layer_norm_maxstd"
        @test row.relerr < 1.0e-5
    end

    @testset "bad arguments" begin
        @test_throws ArgumentError measure_gradient(
            Zygote.pullback,
            normal_new,
            x;
            op = "normalise",
            impl = "normal_new",
            mode = "fwd",
        )
        @test_throws ArgumentError measure_forward(
            normal_new,
            x;
            op = "normalise",
            impl = "normal_new",
            repeats = 0,
        )
        # A JLArray lives on the CPU: it is timed as such.
        @test CrossFuse.measure_backend(JLArray(x)) isa CrossFuse.CPUMeasure
    end

    @testset "write_csv" begin
        row = measure_forward(
            normal_new,
            x;
            op = "normalise",
            impl = "normal_new",
            repeats = 2,
            warmup = 1,
        )
        odd = merge(row, (; device_name = "a, b \"c\""))
        io = IOBuffer()
        write_csv(io, [row, odd])
        lines = split(String(take!(io)), '\n'; keepempty = false)
        @test length(lines) == 3
        @test lines[1] == join(CrossFuse.RESULT_FIELDS, ",")
        @test occursin(",julia,false,cpu,", lines[2])
        @test occursin("\"a, b \"\"c\"\"\"", lines[3])
        @test occursin(",float32,8x16,,fwd,", lines[2]) # causal is missing: an empty field

        path = joinpath(mktempdir(), "sub", "rows.csv")
        @test write_csv(path, [row]) == path
        @test countlines(path) == 2
    end
end
