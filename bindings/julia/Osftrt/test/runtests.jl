# Tests of the Julia binding against the real library, each against a float64
# reference computed here. NOT YET RUN IN JULIA (no Julia on the project's
# machines; see ../README.md); .ci/stage_julia.sh checks the package's
# structure without Julia. Run with:
#   LD_LIBRARY_PATH=$(pkg-config --variable=libdir osftrt) \
#     julia --project=bindings/julia/Osftrt -e 'using Pkg; Pkg.test()'
using Test, Random, LinearAlgebra, Libdl
using Osftrt
const L = Osftrt.LibOsftrt

rng = MersenneTwister(20241125)
# fresh random, never zero
rnd(T, dims...; s = 1.0) = T.(s .* (rand(rng, dims...) .* 2 .- 1) .+ s .* 0.01 .* sign.(randn(rng, dims...)))
relerr(a, b) = maximum(abs.(Float64.(a) .- b)) / max(maximum(abs.(b)), 1e-30)

# The mean cross-entropy of the logits W' X (features-first: X is H x M, W
# is H x V, y 0-based) and its gradient G = dloss/dlogits (V x M), in float64.
function flce_reference(X, W, y)
    M = size(X, 2)
    Z = W' * X                                  # V x M
    mx = maximum(Z; dims = 1)
    lse = vec(mx .+ log.(sum(exp.(Z .- mx); dims = 1)))
    loss = sum(lse[i] - Z[y[i]+1, i] for i in 1:M) / M
    G = exp.(Z .- reshape(lse, 1, :))
    for i in 1:M
        G[y[i]+1, i] -= 1
    end
    return loss, G ./ M
end

@testset "Osftrt" begin

@testset "raw layer: symbols and layouts" begin
    lib = Libdl.dlopen(L.libosftrt)
    for f in L.FUNCTIONS
        @test Libdl.dlsym(lib, f; throw_error = false) !== nothing
    end
    for (name, (size, offs)) in L.C_LAYOUTS
        T = getfield(L, name)
        @test isbitstype(T)
        @test sizeof(T) == size
        @test collect(fieldnames(T)) == first.(offs)
        for (i, (_, off)) in enumerate(offs)
            @test fieldoffset(T, i) == off
        end
    end
    @test Osftrt.version() >= v"1.0.0"
    @test unsafe_string(L.osft_status_string(L.OSFT_STATUS_SHAPE_MISMATCH)) == "shape mismatch"
    # *_INIT defaults come from the library
    o = L.osft_flce_options_t()
    @test o.struct_size == sizeof(L.osft_flce_options_t)
    @test o.ignore_index == -100 && o.reduction == L.OSFT_FLCE_MEAN
    @test L.osft_flinear_options_t().rank_ratio == 0.5
    @test L.osft_comm_options_t().timeout_seconds == 300
    @test L.osft_flce_options_t(; label_smoothing = 0.1).label_smoothing == 0.1
    @test_throws ArgumentError L.osft_flce_options_t(; no_such_field = 1)
end

@testset "CPU thread count (library 1.4)" begin
    n = Osftrt.num_threads()
    @test n >= 1
    Osftrt.set_num_threads(n + 1)
    @test Osftrt.num_threads() == n + 1
    @test_throws Osftrt.OsftError Osftrt.set_num_threads(-1)
    Osftrt.set_num_threads(0)
    @test Osftrt.num_threads() == n
end

@testset "Tensor strides" begin
    A = rnd(Float32, 3, 5)                # Julia 3x5, column-major
    t = Tensor(A)
    @test t.shape == [3, 5] && t.strides == [1, 3]
    t = Tensor(cview(A))                  # the C 5x3 row-major matrix, same memory
    @test t.shape == [5, 3] && t.strides == [3, 1]
    @test t.dl[].data == Ptr{Cvoid}(pointer(A))
    t = Tensor(transpose(A))
    @test t.shape == [5, 3] && t.strides == [3, 1]
    B = rnd(Float64, 8, 4)
    t = Tensor(cview(view(B, 1:6, :)))    # padded rows: row stride 8
    @test t.shape == [4, 6] && t.strides == [8, 1]
    @test t.dl[].dtype.bits == 64
end

ctx = Context()

@testset "FLCE loss and gradients vs float64" begin
    H, V, M = 24, 40, 10
    xj = rnd(Float32, H, M)        # C x: M x H
    Wj = rnd(Float32, H, V)        # C W: V x H
    y = Int64.(rand(rng, 0:V-1, M))
    ce = FLCE(ctx)                 # mean, ignore_index -100
    loss = [NaN32]
    gxj = fill(NaN32, H, M)
    gWj = fill(NaN32, H, V)
    compute!(ce; x = cview(xj), weight = cview(Wj), targets = y, loss = loss,
             grad_x = cview(gxj), grad_weight = cview(gWj))
    X, W = Float64.(xj), Float64.(Wj)
    refloss, G = flce_reference(X, W, y)
    @test abs(loss[1] - refloss) <= 1e-5 * abs(refloss)
    @test relerr(gxj, W * G) <= 1e-4
    @test relerr(gWj, X * G') <= 1e-4
    close(ce)
end

@testset "errors map to exceptions; nothing written on failure" begin
    H, V, M = 8, 12, 4
    xj, Wj = rnd(Float32, H, M), rnd(Float32, H, V)
    ce = FLCE(ctx)
    loss = [NaN32]
    gx = fill(NaN32, H, M)
    bad = Int64[0, 1, V + 5, 2]
    err = try
        compute!(ce; x = cview(xj), weight = cview(Wj), targets = bad, loss = loss, grad_x = cview(gx))
        nothing
    catch e
        e
    end
    @test err isa Osftrt.IndexOutOfRange
    @test err isa OsftError && !isempty(err.message)
    @test isnan(loss[1]) && all(isnan, gx)
    # a plain (column-major) Matrix where row-major is required
    @test_throws Osftrt.BadLayout compute!(ce; x = rnd(Float32, M, H), weight = cview(Wj),
                                             targets = Int64[0, 1, 2, 3], loss = loss)
    @test_throws Osftrt.ShapeMismatch compute!(ce; x = cview(xj), weight = cview(rnd(Float32, H + 1, V)),
                                                 targets = Int64[0, 1, 2, 3], loss = loss)
    @test isnan(loss[1])
    # with the device-side target check the call succeeds with a NaN loss,
    # and check_targets reports the bad target once
    ce2 = FLCE(ctx; device_target_check = 1)
    loss2 = [0f0]
    compute!(ce2; x = cview(xj), weight = cview(Wj), targets = bad, loss = loss2)
    @test isnan(loss2[1])
    @test_throws Osftrt.IndexOutOfRange check_targets(ce2)
    @test check_targets(ce2) === nothing
    close(ce2)
    close(ce)
    close(ce)                                   # idempotent
    @test_throws Osftrt.InvalidHandle compute!(ce; x = cview(xj), weight = cview(Wj),
                                                 targets = Int64[0, 1, 2, 3], loss = loss)
end

@testset "OSFT layer forward/backward and projection vs float64" begin
    N, K, M = 12, 16, 7
    Wj = rnd(Float32, K, N)                     # C W: N x K
    layer = FLinear(ctx, cview(Wj); rank_ratio = 0.5)
    n, k, r, l = Osftrt.dims(layer)
    @test (n, k, r + l) == (N, K, min(N, K))
    W = Float64.(cview(Wj))                     # N x K
    xj = rnd(Float32, K, M)
    yj = fill(NaN32, N, M)
    forward!(layer, cview(yj), cview(xj))
    X = Float64.(cview(xj))                     # M x K
    @test relerr(cview(yj), X * W') <= 1e-4
    Wm = fill(NaN32, K, N)
    merge_weight!(cview(Wm), layer)             # U S V^T, back to the dense weight
    @test relerr(cview(Wm), W) <= 1e-5
    gyj = rnd(Float32, N, M)
    gY = Float64.(cview(gyj))                   # M x N
    Ul = Float64.(collect(factor(layer, :u_low)))
    Sl = Float64.(factor(layer, :s_low))
    Vl = Float64.(collect(factor(layer, :v_low)))
    Uh = Float64.(collect(factor(layer, :u_high)))
    Gm = gY' * X                                # N x K
    gxj, gUj, gSl, gVj = fill(NaN32, K, M), fill(NaN32, l, N), fill(NaN32, l), fill(NaN32, K, l)
    backward!(layer, cview(xj), cview(gyj); grad_x = cview(gxj), grad_u_low = cview(gUj),
              grad_s_low = gSl, grad_v_low = cview(gVj))
    @test relerr(cview(gxj), gY * W) <= 1e-4
    dU = Gm * Vl' * Diagonal(Sl)
    @test relerr(cview(gUj), dU) <= 1e-4
    @test relerr(gSl, diag(Ul' * Gm * Vl')) <= 1e-4
    @test relerr(cview(gVj), Diagonal(Sl) * Ul' * Gm) <= 1e-4
    p = Projector(ctx)
    add_layer!(p, layer; grad_u_low = cview(gUj), grad_v_low = cview(gVj))
    project!(p)
    @test relerr(cview(gUj), dU - Uh * (Uh' * dU)) <= 1e-4
    @test maximum(abs.(Uh' * Float64.(cview(gUj)))) <= 1e-5 * maximum(abs.(dU))
    u, v = orthogonality(p)
    @test u <= 1e-5 && v <= 1e-5
    @test_throws Osftrt.InvalidArgument close(ctx) # children alive: refused, nothing happens
    close(p); close(layer)
    @test_throws Osftrt.InvalidHandle forward!(layer, cview(yj), cview(xj))
end

silu(z) = z / (1 + exp(-z))

@testset "tiled MLP vs untiled and float64" begin
    H, I, M = 16, 24, 11
    Wg, Wu, Wd = rnd(Float32, H, I; s = 0.3), rnd(Float32, H, I; s = 0.3), rnd(Float32, I, H; s = 0.3)
    mlp = MLP(ctx, :swiglu, H, I; gate = cview(Wg), up = cview(Wu), down = cview(Wd))
    xj = rnd(Float32, H, M)
    y3, y1 = fill(NaN32, H, M), fill(NaN32, H, M)
    forward!(mlp, cview(y3), cview(xj); num_tiles = 3)
    forward!(mlp, cview(y1), cview(xj); num_tiles = 1)
    X = Float64.(xj)
    A, B = Float64.(Wg)' * X, Float64.(Wu)' * X     # I x M
    Yref = Float64.(Wd)' * (silu.(A) .* B)          # H x M
    @test relerr(y3, Yref) <= 1e-4
    @test relerr(y3, Float64.(y1)) <= 1e-5
    gy = rnd(Float32, H, M)
    g3, g1 = fill(NaN32, I, H), fill(NaN32, I, H)   # C grad_down: H x I
    backward!(mlp, cview(xj), cview(gy); grad_down = cview(g3), num_tiles = 3)
    backward!(mlp, cview(xj), cview(gy); grad_down = cview(g1), num_tiles = 1)
    Href = silu.(A) .* B                             # I x M
    @test relerr(cview(g3), Float64.(gy) * Href') <= 1e-4   # C: gY^T h = (H x M)(M x I)
    @test relerr(g3, Float64.(g1)) <= 1e-5
    close(mlp)
end

@testset "batched QR: orthogonality and reconstruction" begin
    shapes = [(9, 4), (6, 6), (20, 3)]
    As = [rnd(Float64, n, m) for (m, n) in shapes]           # C A: m x n
    Qs = [fill(NaN, n, m) for (m, n) in shapes]
    Rs = [fill(NaN, n, n) for (m, n) in shapes]
    st = qr_batch!(ctx, [cview(A) for A in As]; q = [cview(Q) for Q in Qs], r = [cview(R) for R in Rs])
    @test all(==(L.OSFT_STATUS_SUCCESS), st)
    for (A, Q, R) in zip(As, Qs, Rs)
        Ac, Qc, Rc = collect(cview(A)), collect(cview(Q)), collect(cview(R))
        n = size(Rc, 1)
        @test maximum(abs.(Qc' * Qc - I)) <= 1e-12
        @test maximum(abs.(Qc * Rc - Ac)) <= 1e-12 * maximum(abs.(Ac)) * 10
        @test istriu(Rc) && all(diag(Rc) .>= 0)
    end
end

@testset "FLCE plans (library 1.2): token chunks and vocabulary slices vs float64" begin
    H, V, M = 12, 50, 13
    xj, Wj = rnd(Float32, H, M), rnd(Float32, H, V)
    y = Int64.(rand(rng, 0:V-1, M))
    X, W = Float64.(xj), Float64.(Wj)
    refloss, G = flce_reference(X, W, y)
    @test L.osft_flce_options_t().chunking == L.OSFT_FLCE_CHUNKING_AUTO
    @test L.osft_flce_options_t().slice_cols == 0
    # (options, chunking reported, chunks, slices, classes per slice)
    cases = [(NamedTuple(), L.OSFT_FLCE_CHUNKING_TOKENS, 1, 1, V),
             ((chunking = :tokens, chunk_rows = 4), L.OSFT_FLCE_CHUNKING_TOKENS, 4, 1, V),
             ((chunking = :vocab, slice_cols = 16), L.OSFT_FLCE_CHUNKING_VOCAB, 1, 4, 16),
             ((chunking = L.OSFT_FLCE_CHUNKING_VOCAB, chunk_rows = 5, slice_cols = 20),
              L.OSFT_FLCE_CHUNKING_VOCAB, 3, 3, 20)]
    for (opts, chunking, chunks, slices, cols) in cases
        ce = FLCE(ctx; opts...)
        loss, gxj, gWj = [NaN32], fill(NaN32, H, M), fill(NaN32, H, V)
        io = (x = cview(xj), weight = cview(Wj), targets = y, loss = loss, grad_x = cview(gxj),
              grad_weight = cview(gWj))
        pl = Osftrt.plan(ce; io...)
        @test isnan(loss[1]) && all(isnan, gxj)  # the plan writes nothing
        @test pl.tokens == M && pl.chunking == chunking && pl.chunks == chunks
        @test pl.slices == slices && pl.slice_cols == cols && pl.scratch_bytes > 0
        compute!(ce; io...)
        @test abs(loss[1] - refloss) <= 1e-5 * abs(refloss)
        @test relerr(gxj, W * G) <= 1e-4
        @test relerr(gWj, X * G') <= 1e-4
        close(ce)
    end
    @test_throws ArgumentError FLCE(ctx; chunking = :rows)
    @test_throws Osftrt.InvalidArgument FLCE(ctx; slice_cols = -1)
    @test_throws Osftrt.InvalidArgument FLCE(ctx; chunking = L.osft_flce_chunking_t(7))
end

@testset "projection arithmetics (library 1.2) and last-call counters" begin
    N, K = 10, 12
    layer = FLinear(ctx, cview(rnd(Float32, K, N)); rank_ratio = 0.5)
    n, k, r, l = Osftrt.dims(layer)
    Uh = Float64.(collect(factor(layer, :u_high)))  # N x r
    Vh = Float64.(collect(factor(layer, :v_high)))  # r x K
    gU0, gV0 = rnd(Float32, l, N), rnd(Float32, K, l)  # C shapes N x l, l x K
    dU, dV = Float64.(cview(gU0)), Float64.(cview(gV0))
    wantU, wantV = dU - Uh * (Uh' * dU), dV - (dV * Vh') * Vh
    @test L.osft_projector_options_t().arithmetic == L.OSFT_PROJECTION_ARITHMETIC_AUTO
    for a in (:auto, :exact, :fp32, :bf16, L.OSFT_PROJECTION_ARITHMETIC_FP32)
        p = Projector(ctx; arithmetic = a)
        gU, gV = copy(gU0), copy(gV0)
        add_layer!(p, layer; grad_u_low = cview(gU), grad_v_low = cview(gV))
        i0 = Osftrt.info(p)
        @test (i0.last_gemms, i0.last_gemm_calls, i0.last_elementwise_calls,
               i0.last_collectives, i0.last_host_waits) == (0, 0, 0, 0, 0)
        project!(p)
        @test relerr(cview(gU), wantU) <= 1e-4
        @test relerr(cview(gV), wantV) <= 1e-4
        i1 = Osftrt.info(p)
        @test i1.targets == 1 && i1.last_gemms >= 4
        @test 1 <= i1.last_gemm_calls <= i1.last_gemms
        @test i1.last_collectives == 0 && i1.last_host_waits == 0
        close(p)
    end
    @test_throws ArgumentError Projector(ctx; arithmetic = :tf32)
    @test_throws Osftrt.InvalidArgument Projector(ctx; arithmetic = L.osft_projection_arithmetic_t(9))
    close(layer)
end

@testset "batched QR: method = :cholesky_tf32 (library 1.2) on Float32" begin
    As = [rnd(Float32, 8, 40), rnd(Float32, 3, 16)]        # C A: 40 x 8, 16 x 3
    Qs = [fill(NaN32, size(A)) for A in As]
    Rs = [fill(NaN32, size(A, 1), size(A, 1)) for A in As]
    st = qr_batch!(ctx, [cview(A) for A in As]; q = [cview(Q) for Q in Qs], r = [cview(R) for R in Rs],
                   method = :cholesky_tf32)
    @test all(==(L.OSFT_STATUS_SUCCESS), st)
    for (A, Q, R) in zip(As, Qs, Rs)
        Ac, Qc, Rc = Float64.(cview(A)), Float64.(cview(Q)), Float64.(cview(R))
        @test maximum(abs.(Qc' * Qc - I)) <= 1e-5
        @test maximum(abs.(Qc * Rc - Ac)) <= 1e-5 * maximum(abs.(Ac))
        @test istriu(Rc) && all(diag(Rc) .>= 0)
    end
    @test_throws ArgumentError qr_batch!(ctx, [cview(As[1])]; method = :givens)
end

@testset "batched QR: rank_deficient (library 1.4)" begin
    @test L.osft_qr_options_t().rank_deficient == C_NULL       # the default: fail
    # C's m x n matrix B C (B m x k, C k x n; k = 0: full rank), Float64:
    # rank k in float64 arithmetic, rank-deficient to working precision.
    cmat(m, n, k) = k > 0 ? rnd(Float64, m, k) * rnd(Float64, k, n) : rnd(Float64, m, n)
    # (m, n, rank (0: full), element type)
    specs = [(12, 5, 0, Float64), (10, 6, 2, Float64), (9, 4, 0, Float32),
             (8, 8, 3, Float32), (7, 3, 0, Float64)]
    deficient = [k > 0 for (m, n, k, T) in specs]
    for method in (:householder, :cholesky_qr2, :cholesky_tf32), factor in (true, false)
        As = [T.(permutedims(cmat(m, n, k))) for (m, n, k, T) in specs]  # stored n x m
        Qs = [fill(T(NaN), n, m) for (m, n, k, T) in specs]
        Rs = [fill(T(NaN), n, n) for (m, n, k, T) in specs]
        kw = (q = [cview(Q) for Q in Qs], r = [cview(R) for R in Rs], method = method)
        if factor
            flags = .!deficient                 # poisoned: every entry must be written
            st = qr_batch!(ctx, [cview(A) for A in As]; kw..., rank_deficient = flags)
            @test all(==(L.OSFT_STATUS_SUCCESS), st)
            @test flags == deficient
        else                                    # without it: the old failure
            @test_throws Osftrt.NumericalError qr_batch!(ctx, [cview(A) for A in As]; kw...)
        end
        for (i, (A, Q, R)) in enumerate(zip(As, Qs, Rs))
            if !factor && deficient[i]          # failed: outputs untouched
                @test all(isnan, Q) && all(isnan, R)
                continue
            end
            tol = eltype(A) == Float32 ? 1e-5 : 1e-12
            Ac, Qc, Rc = Float64.(cview(A)), Float64.(cview(Q)), Float64.(cview(R))
            @test maximum(abs.(Qc' * Qc - I)) <= tol
            @test maximum(abs.(Qc * Rc - Ac)) <= tol * maximum(abs.(Ac)) * size(Rc, 1)
            @test istriu(Rc) && all(diag(Rc) .>= 0)
        end
    end
    # NaN beside a rank-deficient matrix: it still fails (flag false); the
    # other one is factored and flagged.
    nanA, sing = fill(NaN, 3, 4), permutedims(cmat(4, 3, 1))
    Qn, Qs1 = fill(NaN, 3, 4), fill(NaN, 3, 4)
    flags = [true, false]
    @test_throws Osftrt.NumericalError qr_batch!(ctx, [cview(nanA), cview(sing)];
                                                 q = [cview(Qn), cview(Qs1)], rank_deficient = flags)
    @test flags == [false, true]
    @test all(isnan, Qn)
    Qc, Sc = collect(cview(Qs1)), collect(cview(sing))
    @test maximum(abs.(Qc' * Qc - I)) <= 1e-12
    @test maximum(abs.(Qc * (Qc' * Sc) - Sc)) <= 1e-12 * maximum(abs.(Sc))
    # A vector of the wrong length: refused before anything is written.
    Q2 = fill(NaN, 3, 4)
    @test_throws ArgumentError qr_batch!(ctx, [cview(sing)]; q = [cview(Q2)], rank_deficient = falses(2))
    @test all(isnan, Q2)
end

close(ctx)
close(ctx)
@test !isopen(ctx)

end
