"""
    Osftrt

Julia binding of libosftrt. Two layers:

* `Osftrt.LibOsftrt`: the raw C API, GENERATED from the headers
  (`bindings/julia/gen/generate.py`): one `ccall` wrapper per exported
  function, the enums, the opaque handle types, and every options / inputs /
  outputs struct as an `isbits` struct with the C layout and a keyword
  constructor that starts from the library's `*_init` defaults.
* this module: exceptions per status (`Osftrt.ShapeMismatch`, ...), handles
  with finalizers and an idempotent `close`, and Julia arrays passed as
  DLPack tensors.

Arrays and memory order. Julia arrays are column-major; the C API wants
row-major matrices (unit column stride). `Tensor(A)` describes `A` exactly
as Julia indexes it (same logical shape, Julia's strides converted to
DLPack's element strides), so a plain `Matrix` is column-major and a call
that needs row-major rejects it with `Osftrt.BadLayout`. The zero-copy
answer is a transposed view: keep the data as the C shape reversed (a C
`M x H` activation is a Julia `H x M` array, the features-first order Flux
uses as well) and pass `cview(x)` — `PermutedDimsArray(x, (2, 1))` — whose
logical shape is the C shape and whose memory is row-major. `transpose(x)`
and `x'` of real matrices work the same way. Class targets are 0-based C
indices.

Threading (as the C API): a context, and every handle made from it, is used
by one task/thread at a time; different contexts are independent.
"""
module Osftrt

using LinearAlgebra: Adjoint, Transpose

include("LibOsftrt.jl")
using .LibOsftrt
const L = LibOsftrt

export Context, FLCE, FLinear, MLP, Comm, Projector, Tensor, cview, BFloat16
export compute!, check_targets, forward!, backward!, merge_weight!, factor, project!, project_params!,
       orthogonality, qr_batch!, OsftError, set_num_threads, num_threads

# ---------------------------------------------------------------- errors

"""Supertype of every libosftrt failure; `status` and `message` (osft_last_error())."""
abstract type OsftError <: Exception end

const _STATUS_TYPES = Dict{L.osft_status_t, DataType}()

# One exception type per status code of the headers, e.g.
# OSFT_STATUS_SHAPE_MISMATCH -> Osftrt.ShapeMismatch (not exported: several
# names, such as OutOfMemory, read better qualified).
for n in names(LibOsftrt; all = true)
    s = String(n)
    (startswith(s, "OSFT_STATUS_") && s != "OSFT_STATUS_SUCCESS") || continue
    T = Symbol(join(uppercasefirst.(lowercase.(split(s[13:end], "_")))))
    @eval begin
        struct $T <: OsftError
            status::L.osft_status_t
            message::String
        end
        _STATUS_TYPES[$(getfield(LibOsftrt, n))] = $T
    end
end

"""A status this binding does not know (a newer library)."""
struct UnknownStatus <: OsftError
    status::L.osft_status_t
    message::String
end

function Base.showerror(io::IO, e::OsftError)
    print(io, "Osftrt.", nameof(typeof(e)), " (status ", Int(e.status), ", ",
          unsafe_string(L.osft_status_string(e.status)), "): ", e.message)
end

_error(st) = get(_STATUS_TYPES, st, UnknownStatus)(st, unsafe_string(L.osft_last_error()))

"""Throws the exception of status `st` unless it is OSFT_STATUS_SUCCESS."""
@inline check(st) = st == L.OSFT_STATUS_SUCCESS ? nothing : throw(_error(st))

_closed(what) = _STATUS_TYPES[L.OSFT_STATUS_INVALID_HANDLE](
    L.OSFT_STATUS_INVALID_HANDLE, "$what: used after close()")

version() = VersionNumber(unsafe_string(L.osft_version_string()))
build_info() = unsafe_string(L.osft_build_info())

function __init__()
    v = L.osft_version()
    if v ÷ 10000 != L.OSFT_VERSION_MAJOR || v < L.OSFT_VERSION_NUMBER
        error("Osftrt: libosftrt $(v) loaded from $(L.libosftrt), but this binding was " *
              "generated from headers $(L.OSFT_VERSION_NUMBER): need the same major and " *
              "a version at least as new")
    end
end

# ---------------------------------------------------------------- dtypes

"""bfloat16, stored as its 16 bits. Convert with `BFloat16(x::Float32)` (round to
nearest even) and `Float32(b)`."""
primitive type BFloat16 16 end
function BFloat16(x::Float32)
    isnan(x) && return reinterpret(BFloat16, 0x7fc0)
    u = reinterpret(UInt32, x)
    u += 0x00007fff + ((u >> 16) & 0x1)
    return reinterpret(BFloat16, UInt16(u >> 16))
end
BFloat16(x::Real) = BFloat16(Float32(x))
Base.Float32(b::BFloat16) = reinterpret(Float32, UInt32(reinterpret(UInt16, b)) << 16)
Base.Float64(b::BFloat16) = Float64(Float32(b))
Base.convert(::Type{Float32}, b::BFloat16) = Float32(b)
Base.convert(::Type{BFloat16}, x::Real) = BFloat16(x)

dltype(::Type{Float32}) = L.DLDataType(L.kDLFloat, 32, 1)
dltype(::Type{Float64}) = L.DLDataType(L.kDLFloat, 64, 1)
dltype(::Type{Float16}) = L.DLDataType(L.kDLFloat, 16, 1)
dltype(::Type{BFloat16}) = L.DLDataType(L.kDLBfloat, 16, 1)
dltype(::Type{Int32}) = L.DLDataType(L.kDLInt, 32, 1)
dltype(::Type{Int64}) = L.DLDataType(L.kDLInt, 64, 1)
dltype(::Type{T}) where {T} = throw(ArgumentError("Osftrt: no DLPack dtype for $T"))

# ---------------------------------------------------------------- tensors

"""
    Tensor(A)

A DLPack `DLTensor` describing the memory of the Julia array `A` (no copy):
same logical shape as `A`, Julia's strides as DLPack element strides, CPU
device. Works for `Array`s, strided `view`s, `PermutedDimsArray`s and
`transpose`/`adjoint` of real matrices. The `Tensor` keeps `A` alive;
the pointer it hands to C is valid while the `Tensor` is (every function of
this module `GC.@preserve`s it for the call; the library never keeps it).
"""
mutable struct Tensor
    parent::Any
    shape::Vector{Int64}
    strides::Vector{Int64}
    dl::Base.RefValue{L.DLTensor}
end

function _tensor(keep, ptr::Ptr{T}, shape, strides) where {T}
    sh = Int64[shape...]
    st = Int64[strides...]
    dl = L.DLTensor(Ptr{Cvoid}(ptr), L.DLDevice(L.kDLCPU, 0), Int32(length(sh)), dltype(T),
                    pointer(sh), pointer(st), UInt64(0))
    return Tensor(keep, sh, st, Ref(dl))
end

Tensor(t::Tensor) = t
Tensor(A::StridedArray{T}) where {T} = _tensor(A, pointer(A), size(A), strides(A))
function Tensor(A::Union{Transpose{T, <:StridedMatrix{T}}, Adjoint{T, <:StridedMatrix{T}}}) where {T <: Real}
    P = parent(A)
    return _tensor(A, pointer(P), reverse(size(P)), reverse(strides(P)))
end
function Tensor(A::PermutedDimsArray{T, N, perm}) where {T, N, perm}
    P = parent(A)
    P isa StridedArray || throw(ArgumentError("Osftrt.Tensor: the parent of a PermutedDimsArray must be strided"))
    return _tensor(A, pointer(P), ntuple(i -> size(P, perm[i]), N),
                   ntuple(i -> stride(P, perm[i]), N))
end
Tensor(A::AbstractArray) = throw(ArgumentError(
    "Osftrt.Tensor: $(typeof(A)) is not a strided array in memory; collect it first"))

"""
    cview(A)

The row-major view of a Julia array: `PermutedDimsArray(A, (N, ..., 1))`, no
copy. A Julia `H x M` array `x` becomes the `M x H` row-major matrix the C
API documents.
"""
cview(A::AbstractArray{T, N}) where {T, N} = PermutedDimsArray(A, ntuple(i -> N + 1 - i, N))

_t(::Nothing) = nothing
_t(A) = Tensor(A)
_p(::Nothing) = Ptr{L.DLTensor}(C_NULL)
_p(t::Tensor) = Base.unsafe_convert(Ptr{L.DLTensor}, t.dl)

# ---------------------------------------------------------------- handles

abstract type Handle end

"""`close(h)`: destroys the C object. Idempotent; a closed handle throws
`Osftrt.InvalidHandle` when used."""
function Base.close(h::Handle)
    h.ptr == C_NULL && return nothing
    check(_destroy(h))
    h.ptr = typeof(h.ptr)(C_NULL)
    _release(h)
    return nothing
end
Base.isopen(h::Handle) = h.ptr != C_NULL
_release(h::Handle) = nothing
_ptr(h::Handle) = h.ptr == C_NULL ? throw(_closed(string(nameof(typeof(h))))) : h.ptr

# The finalizer backstop: finalizers run in no guaranteed order, so a context
# whose children are still alive (the C call refuses) is finalized again later.
function _finalize(h::Handle)
    h.ptr == C_NULL && return nothing
    st = _destroy(h)
    if st == L.OSFT_STATUS_SUCCESS
        h.ptr = typeof(h.ptr)(C_NULL)
        _release(h)
    elseif st == L.OSFT_STATUS_INVALID_ARGUMENT
        finalizer(_finalize, h)   # children still alive: try again later
    end
    return nothing
end

"""
    Context(; device = :cpu, device_id = 0, workspace_limit = 0, options...)

A libosftrt context (`osft_context_create`). Further keyword arguments are
fields of `osft_context_options_t` (e.g. `allow_tf32 = 1`). Every other handle keeps its
context alive. One task at a time.
"""
mutable struct Context <: Handle
    ptr::L.osft_context_t
    function Context(; device::Symbol = :cpu, device_id::Integer = 0, workspace_limit::Integer = 0,
                     kwargs...)
        dt = device === :cpu ? L.OSFT_DEVICE_CPU : device === :cuda ? L.OSFT_DEVICE_CUDA :
             throw(ArgumentError("device must be :cpu or :cuda"))
        opts = Ref(L.osft_context_options_t(; device_type = dt, device_id = Cint(device_id),
                                              workspace_limit = Csize_t(workspace_limit), kwargs...))
        r = Ref{L.osft_context_t}(C_NULL)
        check(L.osft_context_create(r, opts))
        return finalizer(_finalize, new(r[]))
    end
end
_destroy(c::Context) = L.osft_context_destroy(c.ptr)

function memory_stats(c::Context)
    r = Ref(L.osft_memory_stats_t(Csize_t(sizeof(L.osft_memory_stats_t)), ntuple(_ -> UInt64(0), 7)...))
    check(L.osft_context_get_memory_stats(_ptr(c), r))
    return r[]
end

"""
    set_num_threads(n)

The library's CPU thread count, process-wide: its worker threads and its BLAS
engine's (`osft_set_num_threads`). `0` returns to the automatic count
(`OSFTRT_NUM_THREADS`, `OMP_NUM_THREADS`, the engine's variable, else the
process's CPUs). A Julia host may pass `Threads.nthreads()` or its BLAS's
count. Throws for `n < 0` or `n > 1024`. (Library 1.4.)
"""
set_num_threads(n::Integer) = (check(L.osft_set_num_threads(Cint(n))); nothing)

"""`num_threads()`: the CPU thread count in effect (`osft_get_num_threads`)."""
function num_threads()
    r = Ref{Cint}(0)
    check(L.osft_get_num_threads(r))
    return Int(r[])
end

"""`_enum(table, v)`: the C value of the option `v`, a `Symbol` of `table` or the C value itself."""
function _enum(table::Dict, v)
    v isa Symbol || return v
    haskey(table, v) || throw(ArgumentError("Osftrt: unknown option :$v; one of $(sort!(collect(keys(table))))"))
    return table[v]
end

"""`_zeroed(T)`: a struct of the C API with `struct_size` set and every other field 0 (output structs)."""
_zeroed(::Type{T}) where {T} = T(Csize_t(sizeof(T)), (zero(fieldtype(T, i)) for i in 2:fieldcount(T))...)

const _REDUCTIONS = Dict(:mean => L.OSFT_FLCE_MEAN, :sum => L.OSFT_FLCE_SUM, :none => L.OSFT_FLCE_NONE)
const _CHUNKINGS = Dict(:auto => L.OSFT_FLCE_CHUNKING_AUTO, :tokens => L.OSFT_FLCE_CHUNKING_TOKENS,
                        :vocab => L.OSFT_FLCE_CHUNKING_VOCAB)

"""
    FLCE(ctx; reduction = :mean, chunking = :auto, slice_cols = 0, ignore_index = -100,
         label_smoothing = 0, ...)

Fused linear cross-entropy (`osftrt/flce.h`). Keyword arguments are the
fields of `osft_flce_options_t` (defaults from `osft_flce_options_init`);
`reduction` also takes `:mean`, `:sum`, `:none`; `chunking` (library 1.2)
takes `:auto` (the planner's choice), `:tokens` (chunks of tokens) or
`:vocab` (tiles of tokens x vocabulary slices of at most `slice_cols`
classes; 0: as the budget allows); `comm` takes a `Comm`. `Osftrt.plan`
reports the plan a call takes.
"""
mutable struct FLCE <: Handle
    ptr::L.osft_flce_t
    ctx::Context
    comm::Any
    function FLCE(ctx::Context; reduction = L.OSFT_FLCE_MEAN, chunking = L.OSFT_FLCE_CHUNKING_AUTO,
                  comm = nothing, kwargs...)
        red = _enum(_REDUCTIONS, reduction)
        cp = comm === nothing ? L.osft_comm_t(C_NULL) : _ptr(comm)
        opts = Ref(L.osft_flce_options_t(; reduction = red, chunking = _enum(_CHUNKINGS, chunking),
                                           comm = cp, kwargs...))
        r = Ref{L.osft_flce_t}(C_NULL)
        check(L.osft_flce_create(_ptr(ctx), opts, r))
        return finalizer(_finalize, new(r[], ctx, comm))
    end
end
_destroy(h::FLCE) = L.osft_flce_destroy(h.ptr)

"""
    compute!(ce::FLCE; x, weight, targets, bias, class_weight, grad_loss,
             loss, grad_x, grad_weight, grad_bias, z_loss, accuracy, argmax,
             token_loss, accumulate = 0)

One `osft_flce_compute` call. Inputs and outputs are arrays in the C shapes
(use `cview`); outputs are written in place. Returns `nothing`; throws an
`OsftError` (and writes nothing) on failure.
"""
compute!(ce::FLCE; kwargs...) = _flce_call(L.osft_flce_compute, ce; kwargs...)

"""
    Osftrt.plan(ce::FLCE; x, weight, targets, ..., loss, grad_x, ...)

Validates a call as `compute!` would, with the same keyword arguments, and
returns its `osft_flce_plan_t` (`osft_flce_get_plan`) without computing or
writing anything: `tokens`, `chunk_rows`, `chunks`, `scratch_bytes`,
`budget_bytes`, and (library 1.2) `chunking` (`OSFT_FLCE_CHUNKING_TOKENS` or
`OSFT_FLCE_CHUNKING_VOCAB`), `slices` and `slice_cols`.
"""
function plan(ce::FLCE; kwargs...)
    r = Ref(_zeroed(L.osft_flce_plan_t))
    _flce_call((h, inp, out) -> L.osft_flce_get_plan(h, inp, out, r), ce; kwargs...)
    return r[]
end

function _flce_call(f, ce::FLCE; x, weight, targets, bias = nothing, class_weight = nothing,
                    grad_loss = nothing, loss = nothing, grad_x = nothing, grad_weight = nothing,
                    grad_bias = nothing, z_loss = nothing, accuracy = nothing, argmax = nothing,
                    token_loss = nothing, accumulate::Integer = 0)
    ts = map(_t, (x, weight, targets, bias, class_weight, grad_loss, loss, grad_x,
                  grad_weight, grad_bias, z_loss, accuracy, argmax, token_loss))
    GC.@preserve ts begin
        p = map(_p, ts)
        inp = Ref(L.osft_flce_inputs_t(; x = p[1], weight = p[2], targets = p[3], bias = p[4],
                                         class_weight = p[5], grad_loss = p[6]))
        out = Ref(L.osft_flce_outputs_t(; loss = p[7], grad_x = p[8], grad_weight = p[9],
                                          grad_bias = p[10], z_loss = p[11], accuracy = p[12],
                                          argmax = p[13], token_loss = p[14],
                                          accumulate = UInt32(accumulate)))
        check(f(_ptr(ce), inp, out))
    end
    return nothing
end

"""
    check_targets(ce::FLCE)

Throws `Osftrt.IndexOutOfRange` (naming the call, token and target) if a
call of a handle made with `device_target_check = 1` had a target outside
`[0, V)` since the last check, and clears the record (`osft_flce_check_targets`).
"""
check_targets(ce::FLCE) = (check(L.osft_flce_check_targets(_ptr(ce))); nothing)

const _FACTORS = Dict(:u_high => L.OSFT_FACTOR_U_HIGH, :s_high => L.OSFT_FACTOR_S_HIGH,
                      :v_high => L.OSFT_FACTOR_V_HIGH, :u_low => L.OSFT_FACTOR_U_LOW,
                      :s_low => L.OSFT_FACTOR_S_LOW, :v_low => L.OSFT_FACTOR_V_LOW)

"""
    FLinear(ctx, weight; rank_ratio = 0.5, strategy = OSFT_FLINEAR_AUTO, factor_dtype)
    FLinear(ctx; u_high, s_high, v_high, u_low, s_low, v_low, strategy)

An OSFT layer (`osftrt/flinear.h`): from a dense `N x K` weight (runtime-owned
factors, read and updated through `factor`), or over caller-owned factor
arrays, which the layer keeps referenced (so they stay alive and, Julia's
GC never moving arrays, at the same address) until it is closed.
"""
mutable struct FLinear <: Handle
    ptr::L.osft_flinear_t
    ctx::Context
    keep::Any
    function FLinear(ctx::Context, weight; kwargs...)
        opts = Ref(L.osft_flinear_options_t(; kwargs...))
        t = Tensor(weight)
        r = Ref{L.osft_flinear_t}(C_NULL)
        GC.@preserve t check(L.osft_flinear_create_from_weight(_ptr(ctx), _p(t), opts, r))
        return finalizer(_finalize, new(r[], ctx, nothing))
    end
    function FLinear(ctx::Context; u_high, s_high, v_high, u_low, s_low, v_low, kwargs...)
        ts = map(Tensor, (u_high, s_high, v_high, u_low, s_low, v_low))
        opts = Ref(L.osft_flinear_options_t(; kwargs...))
        r = Ref{L.osft_flinear_t}(C_NULL)
        GC.@preserve ts begin
            p = map(_p, ts)
            f = Ref(L.osft_flinear_factors_t(; u_high = p[1], s_high = p[2], v_high = p[3],
                                               u_low = p[4], s_low = p[5], v_low = p[6]))
            check(L.osft_flinear_create_from_factors(_ptr(ctx), f, opts, r))
        end
        return finalizer(_finalize, new(r[], ctx, ts))
    end
end
_destroy(h::FLinear) = L.osft_flinear_destroy(h.ptr)

"""`dims(layer)`: `(N, K, r, l)`."""
function dims(layer::FLinear)
    n, k, r, l = Ref{Int64}(), Ref{Int64}(), Ref{Int64}(), Ref{Int64}()
    check(L.osft_flinear_get_dims(_ptr(layer), n, k, r, l))
    return (n[], k[], r[], l[])
end

"""
    factor(layer, :u_low)

A view of one factor's memory in its C shape (a row-major matrix as a
`PermutedDimsArray`, a vector as a `Vector`). Writing through it updates the
layer. Valid until the layer is closed or re-decomposed: do not keep it
longer.
"""
function factor(layer::FLinear, which::Symbol)
    v = Ref{L.DLTensor}()
    check(L.osft_flinear_get_factor(_ptr(layer), _FACTORS[which], v))
    d = v[]
    (d.dtype.code == L.kDLFloat && d.dtype.bits == 32) || (d.dtype.code == L.kDLBfloat) ||
        error("unexpected factor dtype")
    T = d.dtype.code == L.kDLFloat ? Float32 : BFloat16
    shape = unsafe_wrap(Array, d.shape, Int(d.ndim))
    if d.ndim == 1
        return unsafe_wrap(Array, Ptr{T}(d.data), Int(shape[1]))
    end
    rows, cols = Int(shape[1]), Int(shape[2])
    rs = d.strides == C_NULL ? cols : Int(unsafe_load(d.strides, 1))
    mem = unsafe_wrap(Array, Ptr{T}(d.data), (rs, rows))
    return PermutedDimsArray(view(mem, 1:cols, :), (2, 1))
end

"""`forward!(layer, y, x; bias = nothing)`: y = x W^T + bias (C shapes)."""
function forward!(layer::FLinear, y, x; bias = nothing)
    ts = (Tensor(x), _t(bias), Tensor(y))
    GC.@preserve ts check(L.osft_flinear_forward(_ptr(layer), _p(ts[1]), _p(ts[2]), _p(ts[3])))
    return y
end

"""`backward!(layer, x, grad_y; grad_x, grad_u_low, grad_s_low, grad_v_low, grad_bias, accumulate = 0)`"""
function backward!(layer::FLinear, x, grad_y; grad_x = nothing, grad_u_low = nothing,
                   grad_s_low = nothing, grad_v_low = nothing, grad_bias = nothing,
                   accumulate::Integer = 0)
    ts = map(_t, (x, grad_y, grad_x, grad_u_low, grad_s_low, grad_v_low, grad_bias))
    GC.@preserve ts begin
        p = map(_p, ts)
        g = Ref(L.osft_flinear_grads_t(; grad_x = p[3], grad_u_low = p[4], grad_s_low = p[5],
                                         grad_v_low = p[6], grad_bias = p[7],
                                         accumulate = UInt32(accumulate)))
        check(L.osft_flinear_backward(_ptr(layer), p[1], p[2], g))
    end
    return nothing
end

"""`merge_weight!(weight, layer)`: writes the dense weight (N x K, C shape)."""
function merge_weight!(weight, layer::FLinear)
    t = Tensor(weight)
    GC.@preserve t check(L.osft_flinear_merge(_ptr(layer), _p(t)))
    return weight
end

"""`Comm(ctx; timeout_seconds = 300)`: the one-rank communicator."""
mutable struct Comm <: Handle
    ptr::L.osft_comm_t
    ctx::Context
    function Comm(ctx::Context; kwargs...)
        opts = Ref(L.osft_comm_options_t(; kwargs...))
        r = Ref{L.osft_comm_t}(C_NULL)
        check(L.osft_comm_create_self(_ptr(ctx), opts, r))
        return finalizer(_finalize, new(r[], ctx))
    end
end
_destroy(h::Comm) = L.osft_comm_destroy(h.ptr)

const _ARITHMETICS = Dict(:auto => L.OSFT_PROJECTION_ARITHMETIC_AUTO,
                          :exact => L.OSFT_PROJECTION_ARITHMETIC_EXACT,
                          :fp32 => L.OSFT_PROJECTION_ARITHMETIC_FP32,
                          :bf16 => L.OSFT_PROJECTION_ARITHMETIC_BF16)

"""
    Projector(ctx; comm = nothing, check_consistency = 1, arithmetic = :auto)

OSFT gradient projection (`osftrt/projection.h`). Registered layers and
gradient arrays are kept referenced until the projector is closed.
`arithmetic` (library 1.2) is the update's arithmetic for every target:
`:auto` (follows each gradient's or factor's dtype), `:exact`, `:fp32`,
`:bf16`, or an `osft_projection_arithmetic_t`. `Osftrt.info(p)` reports
what the projector holds and what its last call did.
"""
mutable struct Projector <: Handle
    ptr::L.osft_projector_t
    ctx::Context
    comm::Any
    keep::Vector{Any}
    function Projector(ctx::Context; comm = nothing, arithmetic = L.OSFT_PROJECTION_ARITHMETIC_AUTO,
                       kwargs...)
        opts = Ref(L.osft_projector_options_t(; arithmetic = _enum(_ARITHMETICS, arithmetic), kwargs...))
        r = Ref{L.osft_projector_t}(C_NULL)
        cp = comm === nothing ? L.osft_comm_t(C_NULL) : _ptr(comm)
        check(L.osft_projector_create(_ptr(ctx), cp, opts, r))
        return finalizer(_finalize, new(r[], ctx, comm, Any[]))
    end
end
_destroy(h::Projector) = L.osft_projector_destroy(h.ptr)

"""`add_layer!(p, layer; grad_u_low, grad_v_low)` -> the target's index."""
function add_layer!(p::Projector, layer::FLinear; grad_u_low = nothing, grad_v_low = nothing)
    ts = (_t(grad_u_low), _t(grad_v_low))
    idx = Ref{Int64}(-1)
    GC.@preserve ts check(L.osft_projector_add_layer(_ptr(p), _ptr(layer), _p(ts[1]), _p(ts[2]), idx))
    push!(p.keep, layer, ts)
    return idx[]
end
export add_layer!

project!(p::Projector) = (check(L.osft_projector_project(_ptr(p))); nothing)
project_params!(p::Projector) = (check(L.osft_projector_project_params(_ptr(p))); nothing)
"""
    Osftrt.info(p::Projector)

The projector's `osft_projector_info_t` (`osft_projector_get_info`):
`targets`, `reduced_elements`, `collectives_per_project`,
`coefficient_bytes`, `gathered_bytes`, `setup_pending`, and (library 1.2)
what the last `project!` / `project_params!` did: `last_gemms`,
`last_gemm_calls`, `last_elementwise_calls`, `last_collectives`,
`last_host_waits` (all 0 before the first call).
"""
function info(p::Projector)
    r = Ref(_zeroed(L.osft_projector_info_t))
    check(L.osft_projector_get_info(_ptr(p), r))
    return r[]
end

"""`orthogonality(p)` -> `(max_u, max_v)`."""
function orthogonality(p::Projector)
    u, v = Ref{Cdouble}(), Ref{Cdouble}()
    check(L.osft_projector_orthogonality(_ptr(p), u, v))
    return (u[], v[])
end

const _VARIANTS = Dict(:swiglu => L.OSFT_MLP_SWIGLU, :geglu_tanh => L.OSFT_MLP_GEGLU_TANH,
                       :geglu_erf => L.OSFT_MLP_GEGLU_ERF, :gelu_tanh => L.OSFT_MLP_GELU_TANH,
                       :gelu_erf => L.OSFT_MLP_GELU_ERF, :silu => L.OSFT_MLP_SILU,
                       :relu => L.OSFT_MLP_RELU)

"""
    MLP(ctx, variant, hidden, intermediate; gate, up, down, gate_bias, up_bias, down_bias, options...)

A tiled MLP (`osftrt/mlp.h`) over dense weights in their C shapes (`I x H`,
`I x H`, `H x I`; use `cview`), or `FLinear` layers. The weights are kept
referenced until the MLP is closed.
"""
mutable struct MLP <: Handle
    ptr::L.osft_mlp_t
    ctx::Context
    keep::Any
    function MLP(ctx::Context, variant, hidden::Integer, intermediate::Integer;
                 gate = nothing, up = nothing, down = nothing, gate_bias = nothing,
                 up_bias = nothing, down_bias = nothing, kwargs...)
        var = variant isa Symbol ? _VARIANTS[variant] : variant
        dense(w) = w isa FLinear ? nothing : _t(w)
        layer(w) = w isa FLinear ? _ptr(w) : L.osft_flinear_t(C_NULL)
        ts = (dense(gate), dense(up), dense(down), _t(gate_bias), _t(up_bias), _t(down_bias))
        opts = Ref(L.osft_mlp_options_t(; kwargs...))
        r = Ref{L.osft_mlp_t}(C_NULL)
        GC.@preserve ts begin
            p = map(_p, ts)
            w = Ref(L.osft_mlp_weights_t(; gate = p[1], up = p[2], down = p[3],
                                           gate_layer = layer(gate), up_layer = layer(up),
                                           down_layer = layer(down), gate_bias = p[4],
                                           up_bias = p[5], down_bias = p[6]))
            check(L.osft_mlp_create(_ptr(ctx), var, Int64(hidden), Int64(intermediate), w, opts, r))
        end
        return finalizer(_finalize, new(r[], ctx, (ts, gate, up, down)))
    end
end
_destroy(h::MLP) = L.osft_mlp_destroy(h.ptr)

"""`forward!(mlp, y, x; num_tiles = 0)`"""
function forward!(mlp::MLP, y, x; num_tiles::Integer = 0)
    ts = (Tensor(x), Tensor(y))
    GC.@preserve ts check(L.osft_mlp_forward(_ptr(mlp), _p(ts[1]), _p(ts[2]), Int64(num_tiles)))
    return y
end

"""`backward!(mlp, x, grad_y; grad_x, grad_gate, grad_up, grad_down, grad_*_bias, accumulate, num_tiles)`
(dense projections; factor gradients of layer projections go through the raw API)."""
function backward!(mlp::MLP, x, grad_y; grad_x = nothing, grad_gate = nothing,
                   grad_up = nothing, grad_down = nothing, grad_gate_bias = nothing,
                   grad_up_bias = nothing, grad_down_bias = nothing,
                   accumulate::Integer = 0, num_tiles::Integer = 0)
    ts = map(_t, (x, grad_y, grad_x, grad_gate, grad_up, grad_down, grad_gate_bias,
                  grad_up_bias, grad_down_bias))
    GC.@preserve ts begin
        p = map(_p, ts)
        g = Ref(L.osft_mlp_grads_t(; grad_x = p[3], grad_gate = p[4], grad_up = p[5],
                                     grad_down = p[6], grad_gate_bias = p[7],
                                     grad_up_bias = p[8], grad_down_bias = p[9],
                                     accumulate = UInt32(accumulate)))
        check(L.osft_mlp_backward(_ptr(mlp), p[1], p[2], g, Int64(num_tiles)))
    end
    return nothing
end

const _QR_METHODS = Dict(:householder => L.OSFT_QR_HOUSEHOLDER,
                         :cholesky_qr2 => L.OSFT_QR_CHOLESKY_QR2,
                         :cholesky_tf32 => L.OSFT_QR_CHOLESKY_TF32)

"""
    qr_batch!(ctx, as; q = nothing, r = nothing, method = :householder,
              rank_deficient = nothing, options...)

`osft_qr_batch` over the list `as` (row-major `m x n` matrices, `m >= n`,
Float32 or Float64; use `cview`). `q === nothing` factors in place; `r` is
`nothing` or a list (entries may be `nothing`). `method` is `:householder`,
`:cholesky_qr2`, `:cholesky_tf32` (library 1.2: TF32 Gram matrices for
Float32 matrices, CholeskyQR2 for Float64) or an `osft_qr_method_t`; the
other keyword arguments are fields of `osft_qr_options_t`. Returns the
per-matrix statuses; throws `Osftrt.NumericalError` when a matrix failed
(the others are written) and the other exceptions before writing anything.

`rank_deficient` (`osft_qr_options_t.rank_deficient`, library 1.4):
`nothing` (the default): a matrix that is rank-deficient to `rank_tolerance`
fails like a non-finite one (its outputs untouched, `NumericalError`
thrown). A `Bool` vector of `length(as)` (e.g. `falses(length(as))`): such
a matrix is factored anyway (Householder QR is defined for any finite
matrix: `Q` orthonormal to working precision, `Q R = A`, `diag(R) >= 0`;
the columns of `Q` beyond the numerical rank are an orthonormal complement
that rounding chose), written, not a failure, and its entry is set to
`true`; every other entry is set to `false`. Matrices with NaN or Inf, or
whose result overflows, still fail. The vector is written whenever the
statuses are (also when `NumericalError` is thrown for another matrix).

```julia
flags = falses(length(as))
qr_batch!(ctx, as; q = qs, rank_deficient = flags)   # flags[i]: factored although singular
```
"""
function qr_batch!(ctx::Context, as::AbstractVector; q = nothing, r = nothing,
                   method = L.OSFT_QR_HOUSEHOLDER, rank_deficient = nothing, kwargs...)
    n = length(as)
    for (name, v) in ((:q, q), (:r, r), (:rank_deficient, rank_deficient))
        v === nothing || length(v) == n ||
            throw(ArgumentError("qr_batch!: $(length(v)) $name entries for $n matrices"))
    end
    ta = Tensor[Tensor(a) for a in as]
    tq = q === nothing ? nothing : Tensor[Tensor(x) for x in q]
    tr = r === nothing ? nothing : Any[_t(x) for x in r]
    status = fill(L.OSFT_STATUS_INTERNAL_ERROR, n)
    flags = zeros(Cint, max(n, 1))  # the C int array of rank_deficient
    st = GC.@preserve ta tq tr status flags begin
        opts = Ref(L.osft_qr_options_t(; method = _enum(_QR_METHODS, method), kwargs...,
                                       rank_deficient = rank_deficient === nothing ?
                                                        Ptr{Cint}(C_NULL) : pointer(flags)))
        pa = Ptr{L.DLTensor}[_p(t) for t in ta]
        pq = tq === nothing ? Ptr{L.DLTensor}[] : Ptr{L.DLTensor}[_p(t) for t in tq]
        pr = tr === nothing ? Ptr{L.DLTensor}[] : Ptr{L.DLTensor}[_p(t) for t in tr]
        GC.@preserve pa pq pr L.osft_qr_batch(
            _ptr(ctx), opts, Csize_t(n), pointer(pa),
            tq === nothing ? Ptr{Ptr{L.DLTensor}}(C_NULL) : pointer(pq),
            tr === nothing ? Ptr{Ptr{L.DLTensor}}(C_NULL) : pointer(pr),
            pointer(status))
    end
    if rank_deficient !== nothing &&
       (st == L.OSFT_STATUS_SUCCESS || st == L.OSFT_STATUS_NUMERICAL_ERROR)
        for i in 1:n
            rank_deficient[i] = flags[i] != 0
        end
    end
    check(st)
    return status
end

end # module Osftrt
