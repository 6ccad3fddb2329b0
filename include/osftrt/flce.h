/**
 * @file
 * @brief libosftrt — fused linear cross-entropy (the LM-head loss), with the
 * logits never materialized.
 *
 * For hidden states x (M x H, M tokens), a weight W (V x H, V classes), an
 * optional bias b (V) and class targets y (M), one call computes the loss of
 *
 * @code{.unparsed}
 *   z = x W^T + b                 logits, M x V (never held whole)
 *   z = s * tanh(z / s)           optional logit softcap s
 *   lse = log sum_j exp(z_j),  p = softmax(z)
 * @endcode
 *
 * and, when asked, dL/dx, dL/dW and dL/db. Per token i, with label
 * smoothing a (eps = a / V), z-loss scale lambda and class weights w
 * (all 1 without them; Wsum = sum_j w_j):
 *
 * @code{.unparsed}
 *   ce_i   = (1 - a) w_y (lse - z_y) + eps (lse Wsum - sum_j w_j z_j)
 *   zl_i   = lambda lse^2            the z-loss: never times a class weight
 *   loss_i = ce_i + zl_i
 *   dce_i/dz_j = ((1 - a) w_y + eps Wsum) p_j - eps w_j - (1 - a) w_y [j == y]
 *   dzl_i/dz_j = 2 lambda lse p_j
 * @endcode
 *
 * times the softcap's chain factor 1 - tanh^2 where it is on. Tokens whose
 * target equals ignore_index contribute nothing (loss 0, gradient 0).
 *
 * @par Reductions
 * With D = the sum of w_y over the tokens that are not ignored (their count
 * without class weights) and N = the number of tokens that are not ignored:
 *
 * @code{.unparsed}
 *   OSFT_FLCE_MEAN:  L = sum_i ce_i / D + sum_i zl_i / N
 *   OSFT_FLCE_SUM:   L = sum_i ce_i + sum_i zl_i
 *   OSFT_FLCE_NONE:  L_i = ce_i + zl_i             (one per token)
 * @endcode
 *
 * and the gradients are those of L (for MEAN: dce_i/dz / D + dzl_i/dz / N
 * per token, times grad_loss). So under MEAN the cross-entropy part is the
 * class-weighted mean of torch.nn.functional.cross_entropy(weight=,
 * label_smoothing=), and the z-loss part the plain mean of lambda lse^2 over
 * the tokens that count, as in Liger-Kernel and PaLM: scaling every class
 * weight by a constant changes neither. A part whose denominator is 0 is
 * defined as 0, its gradient 0 (not NaN): D = 0 (every target ignored, or
 * all their class weights 0) drops the cross-entropy part of MEAN, N = 0
 * (every target ignored, or a call with no tokens) all of it. Changed after
 * 1.0.0: MEAN used to divide the z-loss part by D as well (L = sum_i loss_i
 * / D); see the change log in ABI.md. How the options of Liger-Kernel, Cut
 * Cross-Entropy and PyTorch map onto these: see "Compatibility" below.
 *
 * @par How it runs
 * Tokens are processed in chunks of C rows. Per chunk:
 * the logits chunk (C x V, fp32) is computed into a reused scratch buffer by
 * a GEMM; one row pass computes the row statistics in fp32 (an online
 * max/sum, the target logit, the smoothing sum, the argmax) and writes the
 * gradient over the logits in place; then grad_x[chunk] = g W and
 * grad_W += g^T x[chunk] run as GEMMs that accumulate themselves (beta = 1,
 * fp32 accumulation), and grad_b += column sums of g. The chunk size C
 * comes from the memory budget (osft_flce_options_t::memory_budget); a
 * larger budget means fewer read-modify-writes of grad_W.
 *
 * @par The vocabulary plan
 * When the budget holds only a few token rows of logits (Llama-3's V =
 * 128256 at 64 MiB: about 128 rows, each chunk a read-modify-write of all
 * of grad_W), the call may chunk the vocabulary instead: tiles of R tokens
 * x S classes (S < V). Pass 1 runs over the S-wide slices of W, computing
 * each tile's logits and keeping per row only a record of 8 floats (the
 * running max and sum of exponentials, the target logit and class weight,
 * the smoothing sum, the argmax), merged slice by slice; pass 2 recomputes
 * each slice's logits (the last slice of pass 1 is still in the buffer),
 * writes the gradient from the merged records, adds g W[slice] into
 * grad_x[rows] and writes grad_W[slice] (and grad_b[slice]) once per token
 * tile: with R = M, once. That is 4 GEMMs' worth of work instead of 3 at
 * any budget, with no V x H accumulator traffic. The planner
 * (osft_flce_options_t::chunking, default automatic) compares both plans
 * by a cost model of their GEMMs and their memory traffic and reports its
 * choice in osft_flce_get_plan() (osft_flce_plan_t::chunking). Both plans
 * give the same results up to fp32 rounding (the row statistics combine
 * per slice as under vocab parallelism), with every option, reduction and
 * output, and with vocab parallelism (each rank slices its own shard; the
 * ranks exchange one merged record per row and token tile).
 *
 * @par Scratch memory
 * Scratch memory (taken from the context's workspace, counted by
 * osft_context_get_memory_stats) is, in bytes:
 * @code{.unparsed}
 *   per chunk row   4 * Vp (fp32 logits; Vp = V rounded up to 16)
 *                   + 4 * H on the CPU with bf16 x (x widened for OpenBLAS)
 *   fixed           16 * M (per-token loss, z-loss, argmax) + small,
 *                   + 4 * V * H when grad_weight is bf16, the
 *                     accumulator is OSFT_FLCE_ACCUMULATOR_FP32 and the
 *                     call runs in more than one chunk,
 *                   + 4 * V * H on the CPU with a bf16 weight (widened once),
 *                   + 4 * V when grad_bias is bf16 (likewise).
 * @endcode
 * A call whose M rows fit in one chunk within the budget (with
 * vocab parallelism off and chunk_rows 0 or at least M) runs in one chunk
 * without the fp32 accumulators: its backward GEMM sums the M rows in fp32
 * and rounds once, as the accumulator would. The vocabulary plan (tiles of
 * R tokens x S classes, above) takes instead:
 * @code{.unparsed}
 *   per tile        4 * R * Sp (fp32 logits; Sp = S rounded up to 16)
 *                   + 64 * R (row records) + 32 * R * P with P > 1 ranks
 *                   + 4 * R * H on the CPU with bf16 x (x widened)
 *                   + 4 * S * H on the CPU with a bf16 weight (each slice
 *                     of W widened when used: never all of W)
 *                   + 4 * R * H when grad_x is bf16, the accumulator is
 *                     OSFT_FLCE_ACCUMULATOR_FP32 and S < V (grad_x summed
 *                     over the slices in fp32)
 *   fixed           16 * M (per-token loss, z-loss, argmax) + small,
 *                   + 4 * V * H (4 * V) for a bf16 grad_weight (grad_bias)
 *                     with the fp32 accumulator when R < M.
 * @endcode
 * With OSFT_FLCE_ACCUMULATOR_OUTPUT a bf16 grad_x is summed over the slices
 * in bf16 (rounded once per slice), as grad_weight is over token chunks.
 * osft_flce_get_plan() reports the chunk size and the scratch of a call.
 * The GEMMs and the bias-gradient sum may take small temporaries of their
 * own, not counted in the budget: C x H floats on the CPU with a bf16
 * grad_x, a few times V floats on CUDA with grad_bias, and S x H floats for
 * a bf16 grad_weight under the vocabulary plan on a CPU engine with bf16
 * GEMMs (oneMKL: its GEMM writes fp32).
 *
 * @par The default plan on the CPU
 * With memory_budget 0 on a CPU context the chunk buffers are those of the
 * CUDA default below (room for 512 token rows, or 16 M H bytes), but, for
 * a call that can keep its logits in grad_weight (below) or asks for no
 * gradient, at most 32 times x's bytes or 8 MiB, whichever is larger, so
 * that small batches take small scratch too (after 1.3.0, whose default
 * made room for 512 token rows: the whole M x V logits block at small M).
 * Such budgets would make the token plan re-read and re-write grad_W once
 * per small chunk, so a call that overwrites an fp32 compact grad_weight
 * (its accumulate bit clear) on one rank keeps logits in grad_weight's own
 * V x H floats instead: the M x Vp logits of up to V H / Vp ~ H rows,
 * computed slice by slice into it (three GEMMs, nothing recomputed), then
 * from the last slice to the first the gradient, grad_x += g W[slice] and
 * grad_W[slice] = g^T x, each slice's rows written once where no logits
 * still to be read lie. Its scratch is a few floats per row and one
 * slice's gradient (GPT-2 at 256 tokens: 1 MiB instead of the 49 MiB
 * block, within 5% of the block's time: bench/results/flce_default_cpu.md).
 * Rows beyond those are kept in scratch as far as the budget allows, and
 * the rest follow in token chunks. osft_flce_get_plan() reports it as the
 * vocabulary plan (one tile of M rows) when it keeps all M rows, else as
 * the token plan whose first chunk holds the kept rows (chunk_rows: that
 * chunk's rows; the others have fewer). The planner takes it where its
 * cost model finds it 1% cheaper than the best other plan, and under the
 * default budget also at a tie (within 1%) with a plan of more than 8 MiB
 * of scratch (it takes the least); never with chunking TOKENS, a chunk_rows
 * below M or a slice_cols that is not a multiple of 16; with chunking VOCAB
 * only when it keeps all M rows. A call without gradients runs in
 * vocabulary slices (one GEMM either way). A frozen head (grad_x without
 * grad_weight), an accumulated or bf16 grad_weight, or chunking TOKENS keep
 * the 1.3.0 default (small token chunks would cost up to 20%): an
 * accumulating trainer passes the accumulate bit clear on its first
 * micro-batch, whose call then overwrites (zeroes) grad_weight. CUDA
 * contexts keep the 1.3.0 default (below).
 *
 * @par Precision
 * x and W are fp32 or bf16 (the same dtype). GEMMs take their
 * operands in that dtype and accumulate in fp32 (on the CPU, bf16 operands
 * are widened to fp32 first). Logits, row statistics and the loss are fp32
 * (sums over tokens in fp64). The in-place gradient g is fp32, or bf16 on
 * CUDA with bf16 x (the backward GEMMs then run on tensor cores).
 *
 * @par Validation
 * Every argument is checked before anything is written:
 * shapes, dtypes, layouts, devices, overlaps, and the target values (a
 * target outside [0, V) that is not ignore_index fails with
 * OSFT_STATUS_INDEX_OUT_OF_RANGE naming the first such token). On CUDA the
 * target check runs on the device and the call waits for its result (a
 * small kernel and a 40-byte copy) before it enqueues any write to an
 * output; everything after that is asynchronous on the context's stream.
 * Because of that wait, a call cannot be captured into a CUDA graph.
 *
 * @par Use in a trainer
 * The loss and the gradients come from one call, so an
 * autograd framework calls it in its forward with the gradients requested
 * and hands them out in the backward. Where the upstream gradient is known
 * in advance (1, or 1 / steps under gradient accumulation) pass it as
 * grad_loss: it is folded into the gradient, with no rescaling pass over
 * grad_W afterwards. Evaluation uses forward-only calls:
 *
 * @code
 *   osft_flce_t ce;   osft_flce_options_t o;   OSFT_FLCE_OPTIONS_INIT(&o);
 *   o.ignore_index = -100;   o.memory_budget = 1u << 30;
 *   osft_flce_create(ctx, &o, &ce);
 *   osft_flce_inputs_t in;    OSFT_FLCE_INPUTS_INIT(&in);
 *   in.x = &hidden;  in.weight = &lm_head;  in.targets = &labels;
 *   osft_flce_outputs_t out;  OSFT_FLCE_OUTPUTS_INIT(&out);
 *   out.loss = &loss;  out.grad_x = &d_hidden;  out.grad_weight = &d_lm_head;
 *   out.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT;  // over micro-batches
 *   if (osft_flce_compute(ce, &in, &out) != OSFT_STATUS_SUCCESS)
 *     fprintf(stderr, "%s\n", osft_last_error());
 *   osft_flce_destroy(ce);
 * @endcode
 *
 * @par A padded vocabulary
 * Every row of in->weight is a class. Trainers often pad the LM head to a
 * multiple for their GEMMs (GPT-2: 50257 classes in 50304 rows); passing the
 * padded weight makes the padding rows classes too (their logits count in
 * lse: with zero rows, 47 extra logits of 0 raise GPT-2's loss by ~9e-4)
 * and writes gradient into them. Pass a [V, H] view of the first V rows
 * instead, for in->weight and out->grad_weight alike (the same data
 * pointer, shape[0] = V; the first V rows of a compact [Vp, H] matrix are
 * themselves compact), and V-element views of bias, class_weight and
 * grad_bias; targets then lie in [0, V), and the padding rows of
 * grad_weight are never written. (The "Vp" of the scratch formulas below is
 * V rounded up to 16, an internal size, not a padded weight.) The C++ API
 * does this from one field, osftrt::FlceInputs::num_classes.
 *
 * @code
 *   int64_t real[2] = {50257, 768};    // the classes, not the 50304 rows
 *   DLTensor w = lm_head, dw = d_lm_head;
 *   w.shape = real;   dw.shape = real;  // same data, strides NULL (compact)
 *   in.weight = &w;   out.grad_weight = &dw;
 * @endcode
 *
 * @par One call, or a forward and a backward
 * The loss and the gradients come from one pass over the tokens: the logits
 * GEMM (2 M V H flops), then the grad_x and grad_W GEMMs (2 M V H each), 3
 * GEMMs in all, with the logits of a chunk never leaving scratch. A split
 * API, a forward that keeps per token only lse and the target logit (8
 * bytes) and a backward that recomputes the logits from x and W, would need
 * the logits GEMM twice: 4 GEMMs instead of 3, a floor of ~1.33x the fused
 * call (the same price as the vocabulary plan), for the convenience of
 * separate phases. This library keeps the fused call; a trainer whose
 * forward, zero-grad and backward are separate phases calls it in the
 * forward with the gradients requested (grad_loss, e.g. 1 / micro-batches,
 * must then be known in advance: it is folded in), keeps grad_x (M x H) for
 * its backward, and either zeroes its gradients before the forward or
 * leaves grad_W and grad_b out of its zero-grad: with accumulate 0 the
 * call overwrites them, which is the zeroing (accumulate
 * OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT on the later micro-batches). Or it pays
 * the split's price with the calls that exist: a forward-only call for the
 * loss in its forward (one GEMM), the full call with the gradients in its
 * backward (three, grad_loss known by then): 4 GEMMs, nothing held between
 * the phases (osftrt::Flce::forward and backward in the C++ API).
 *
 * @par Vocab parallelism
 * With a communicator of P > 1 ranks in the options,
 * W is sharded over V: rank p passes rows [vocab_offset_p, vocab_offset_p +
 * V_p) of the global weight as in->weight (V_p >= 1 rows; uneven shards are
 * fine; the shards must tile [0, vocab_size_global) exactly, which the call
 * checks). x, targets (GLOBAL class ids), grad_loss and every output except
 * grad_weight and grad_bias are the same on every rank; bias, class_weight,
 * grad_weight and grad_bias are this rank's shard (V_p entries or rows).
 * Every rank makes the same calls in the same order (collectives).
 * Per chunk each rank computes its local logits and a compact per-row
 * record (local max, sum of exponentials relative to it, the target logit
 * and class weight when the target is in its shard else 0, the smoothing
 * sum, the argmax candidate and its value: 8 floats), ONE all-gather per
 * chunk collects the records of all ranks, and every rank combines them in
 * rank order (the max trick: M = max_p m_p, S = sum_p s_p e^(m_p - M)) into
 * the global lse, loss, z-loss and argmax (lowest global index on ties),
 * then forms its gradient columns with the global lse. The call starts with
 * one exchange of per-rank totals (the partial sums of Wsum and D, which
 * add up to the global ones; N needs no exchange, every rank counts the
 * replicated targets; the target check, the shard bounds, the shapes and
 * whether grad_x is requested, which must agree); every rank then chunks
 * with the fewest rows any rank's budget allows. Argument errors a rank
 * finds before that exchange are its own: the other ranks then wait in it
 * until the communicator's timeout. grad_x
 * is all-reduced (sum) ONCE at the end over the whole tensor (same bytes as
 * per chunk, fewer collectives; a grad_x padded on any rank is reduced row
 * by row); with OSFT_FLCE_ACCUMULATE_GRAD_X rank 0's old grad_x is the
 * base that the gradient is added to (the other ranks' old values do not
 * count). Results equal the single-rank ones up to rounding (the loss terms
 * and the argmax combine in fp32). A communicator of one rank takes the
 * single-rank path: its results are bit-identical to no communicator. On
 * CUDA use a NCCL communicator on the same context (collectives on device
 * buffers).
 *
 * @par Compatibility
 * What each option of the usual peers maps to, and what still differs. In
 * every row "same" means the same loss and gradients up to rounding, which
 * tests/c/test_flce_semantics.c checks against a float64 reference of the
 * formulas above for every combination of the options.
 *
 * @code{.unparsed}
 * Liger-Kernel LigerFusedLinearCrossEntropyLoss / liger_fused_linear_cross_entropy
 *   (_input, lin_weight, target, bias) -> in->x, in->weight, in->targets, in->bias
 *   ce_weight         in->class_weight (fp32, V). Same: ce_i as above (the
 *                     smoothing term weighted by w_j, Wsum = sum of all w_j),
 *                     MEAN divides the CE part by D. Differs only at D = 0
 *                     with N > 0: Liger divides by 0 (NaN), here the part is 0.
 *   ignore_index      opts.ignore_index (default -100 in both). Same: such
 *                     tokens leave the loss, N, D, the z-loss and the
 *                     gradient; an ignore_index inside [0, V) still counts
 *                     in Wsum and in the smoothing sum of the other tokens.
 *   lse_square_scale  opts.z_loss_scale. Same: lambda lse^2 per token not
 *                     ignored, not class-weighted; MEAN divides by N
 *                     (Liger's n_non_ignore), SUM sums, NONE per token.
 *   label_smoothing   opts.label_smoothing. Same: eps = a / V.
 *   reduction         opts.reduction: "mean" MEAN, "sum" SUM, "none" NONE.
 *                     NONE takes the per-token upstream gradient as
 *                     in->grad_loss at the call (Liger folds it in backward).
 *   softcap           opts.softcap (None: 0). Same: s tanh(z / s) of the
 *                     logits after the bias, gradient times 1 - tanh^2.
 *   return_z_loss     out->z_loss. Same value; fp32 here, where Liger returns
 *                     it in the input's dtype (rounded to bf16 for bf16 x).
 *   accum_dtype       opts.accumulator: torch.float32 is
 *                     OSFT_FLCE_ACCUMULATOR_FP32 (the default here); None
 *                     (Liger's default: grad_weight and grad_bias summed in
 *                     the parameter dtype) is OSFT_FLCE_ACCUMULATOR_OUTPUT,
 *                     rounding after each chunk (chunk sizes differ, so the
 *                     bf16 rounding does too).
 *   return_token_accuracy    out->accuracy (one fraction for every reduction;
 *                     Liger gives per-token values under "none").
 *   return_predicted_tokens  out->argmax (written for ignored tokens too).
 *   use_token_scaling        none.
 *   Precision: Liger forms the logits chunk in the input dtype (bf16 logits,
 *   bias added in bf16) and writes the logit gradient into it; here the
 *   logits are fp32 (fp32 GEMM accumulation, bias added in fp32). bf16 runs
 *   therefore differ by the bf16 rounding of the logits, not by formula.
 *
 * Apple Cut Cross-Entropy linear_cross_entropy(e, c, targets, bias, ...)
 *   e, c, targets, bias  in->x, in->weight, in->targets, in->bias
 *   ignore_index      opts.ignore_index (default -100 in both). Same.
 *   softcap           opts.softcap (None: 0). Same.
 *   reduction         opts.reduction. Same: "mean" is over N (CCE has no
 *                     class weights). Every token ignored: CCE's mean is NaN,
 *                     here 0.
 *   shift             none: pass targets already shifted (targets[t] =
 *                     labels[t + shift], the last shift positions of each
 *                     sequence ignore_index). Same loss for MEAN and SUM;
 *                     NONE then has shift zeros per sequence more.
 *   filter_eps, filter_e_grad, filter_c_grad   none: no gradient entry is
 *                     ever skipped, as filter_eps=None (impl "cce_exact").
 *   accum_e_fp32      no option: each grad_x row comes from one GEMM with
 *                     fp32 accumulation (as accum_e_fp32=True).
 *   accum_c_fp32      opts.accumulator: True is OSFT_FLCE_ACCUMULATOR_FP32,
 *                     False OSFT_FLCE_ACCUMULATOR_OUTPUT.
 *   impl              none (one implementation per device).
 *   vocab_parallel_options=VocabParallelOptions(start, stop, group)
 *                     opts.comm, opts.vocab_offset = start,
 *                     opts.vocab_size_global = V; stop is vocab_offset plus
 *                     in->weight's rows. Same: every rank gets the loss and
 *                     grad_x, and its own rows of the classifier gradient.
 *   return_lse with cut_cross_entropy.utils.compute_z_loss: MEAN loss +
 *                     lambda * compute_z_loss(lse, targets) is MEAN with
 *                     z_loss_scale = lambda (both over N).
 *   (CCE has no class weights and no label smoothing.)
 *
 * PyTorch F.cross_entropy(x @ W.T + b, target, weight, ignore_index,
 *                         reduction, label_smoothing)
 *   weight            in->class_weight. Same, label smoothing included
 *                     (eps sum_j w_j (lse - z_j), MEAN over D).
 *   ignore_index      opts.ignore_index. Same (default -100 in both).
 *   reduction         opts.reduction. Same; MEAN with every token ignored or
 *                     D = 0 is NaN in PyTorch, 0 here.
 *   label_smoothing   opts.label_smoothing. Same.
 *   size_average, reduce   deprecated in PyTorch: use reduction.
 *   probability (soft) targets   not supported.
 *   z-loss            not in PyTorch: F.cross_entropy(...) + lambda *
 *                     (lse[valid] ** 2).mean() is MEAN with z_loss_scale =
 *                     lambda; .sum() with reduction="sum" is SUM.
 *   softcap           not in PyTorch: s * torch.tanh(logits / s) first.
 *   Precision: PyTorch on bf16 logits rounds them to bf16 first; the usual
 *   logits.float() matches the fp32 logits here.
 * @endcode
 *
 * @par Thread safety
 * Threading: a handle belongs to its context; use it from one thread at a
 * time (like the context). Handles on different contexts are independent.
 *
 * @par Non-finite values (NaN, Inf)
 * Option fields: label_smoothing NaN (outside [0, 1]) and a non-finite or
 * negative z_loss_scale or softcap are refused at osft_flce_create with
 * OSFT_STATUS_INVALID_ARGUMENT. Tensor values are not checked (targets are
 * integers and range-checked): NaN/Inf in x, weight, bias, class_weight or
 * grad_loss propagate into the per-token loss of the affected tokens (an Inf
 * logit gives NaN), the reduced loss, z_loss and the gradients; the call
 * succeeds. argmax of a token whose logits are NaN is 0 (NaN never compares
 * greater), and accuracy counts it as such. Finite but huge values (1e30) are
 * handled by the max-shifted log-sum-exp without overflow.
 */
#ifndef OSFTRT_FLCE_H
#define OSFTRT_FLCE_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/comm.h"
#include "osftrt/context.h"
#include "osftrt/export.h"
#include "osftrt/status.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_flce Fused linear cross-entropy
 * @brief The LM-head loss and its gradients in one chunked pass, with the
 * logits never materialized (osftrt/flce.h).
 *
 * The formulas, the chunking, the scratch memory, the precision and vocab
 * parallelism are described in flce.h.
 * @{
 */

/** @brief An opaque fused linear cross-entropy handle: the loss settings. */
typedef struct osft_flce_s *osft_flce_t;

/** @brief How per-token losses are combined. Values fixed forever (ABI.md). */
typedef enum osft_flce_reduction_e {
  OSFT_FLCE_MEAN = 0, /**< CE part / D + z-loss part / N (see above): a scalar */
  OSFT_FLCE_SUM = 1,  /**< a scalar */
  OSFT_FLCE_NONE = 2  /**< one loss per token */
} osft_flce_reduction_t;

/**
 * @brief Where grad_weight and grad_bias are summed over chunks (and, in the
 * vocabulary plan, a bf16 grad_x over the vocabulary slices).
 *
 * Values fixed forever. Both are the same for fp32 gradients.
 */
typedef enum osft_flce_accumulator_e {
  /** An fp32 accumulator (scratch of V x H floats for a bf16 grad_weight),
   * rounded once to the gradient's dtype at the end; a one-chunk call needs
   * none (its GEMM accumulates in fp32 and rounds once). Default. */
  OSFT_FLCE_ACCUMULATOR_FP32 = 0,
  /** In the gradient's own dtype: a bf16 grad_weight is rounded after every
   * chunk. Saves the 4 * V * H bytes of scratch, costs precision. On the
   * CPU the GEMM still widens grad_weight to fp32 per chunk (no saving). The
   * vocabulary plan likewise rounds a bf16 grad_x after every slice (saving
   * 4 * R * H bytes). */
  OSFT_FLCE_ACCUMULATOR_OUTPUT = 1
} osft_flce_accumulator_t;

/**
 * @brief What a call chunks (see "The vocabulary plan" above).
 *
 * Values fixed forever. Added in 1.2.0.
 */
typedef enum osft_flce_chunking_e {
  /** The planner chooses from the budget and the shapes: the plan its cost
   * model (GEMM flops plus the memory traffic of each plan) finds cheaper.
   * Default. */
  OSFT_FLCE_CHUNKING_AUTO = 0,
  /** Chunks of tokens over the whole vocabulary (three GEMMs, grad_W summed
   * over the chunks). */
  OSFT_FLCE_CHUNKING_TOKENS = 1,
  /** Tiles of tokens x vocabulary slices in two passes (four GEMMs' worth,
   * grad_W written once per token tile). */
  OSFT_FLCE_CHUNKING_VOCAB = 2
} osft_flce_chunking_t;

/** @brief Options of a handle. Initialize with OSFT_FLCE_OPTIONS_INIT(&o). */
typedef struct osft_flce_options_s {
  size_t struct_size; /**< sizeof(osft_flce_options_t) as compiled */
  /** Tokens with this target are ignored (any value; it may lie in
   * [0, V), which then ignores that class). Default -100. */
  int64_t ignore_index;
  /** Label smoothing a in [0, 1]. Default 0. */
  double label_smoothing;
  /** z-loss scale lambda >= 0 (adds lambda * lse^2 per token). Default 0. */
  double z_loss_scale;
  /** Logit softcap s: z = s * tanh(z / s); 0 turns it off, otherwise it
   * must be positive and finite. Default 0. */
  double softcap;
  /** Default OSFT_FLCE_MEAN. */
  osft_flce_reduction_t reduction;
  /** Default OSFT_FLCE_ACCUMULATOR_FP32. */
  osft_flce_accumulator_t accumulator;
  /** Upper bound, in bytes, on the scratch a call takes (fixed part
   * included, see above); it decides the chunk size. 0 on a CPU context:
   * see "The default plan on the CPU" above. 0 on CUDA: the fixed part plus
   * chunk buffers that grow no faster than x does: logits of at most 4 x
   * x's elements (16 * M * H bytes; Liger-Kernel's chunks hold logits of
   * about x's size), but room for at least 512 token rows (4 * Vp bytes
   * each, see "Scratch memory") and at most 1 GiB (since 1.3; before, 1 GiB
   * whatever M, so that the default built the whole M x V logits as scratch
   * up to 1 GiB). A long-context trainer that wants a constant scratch sets
   * an explicit budget (e.g. 64 MiB: see the README, "Long context"). The
   * context's workspace_limit, if set, bounds it too. A budget too small
   * for one row fails with OSFT_STATUS_OUT_OF_MEMORY, naming the minimum.
   * Default 0. */
  size_t memory_budget;
  /** At most this many tokens per chunk (exactly this many, the last chunk
   * excepted, when the budget allows); 0: as many as the budget allows,
   * balanced over the chunks (the vocabulary plan's token tiles alike).
   * Must be >= 0. Default 0. */
  int64_t chunk_rows;
  /** Vocab parallelism (see the top of this file): a communicator on the
   * handle's context, or NULL (default: no vocab parallelism). The handle
   * holds it in use (osft_comm_destroy refuses it) until the handle is
   * destroyed. */
  osft_comm_t comm;
  /** The first global class of this rank's shard of W: >= 0; must be 0
   * without comm. Default 0. */
  int64_t vocab_offset;
  /** The global number of classes V (the sum of the shard sizes). With comm:
   * > vocab_offset; with a one-rank comm 0 or in->weight's rows (0: V is
   * in->weight's rows). Without comm: 0. Default 0. */
  int64_t vocab_size_global;
  /** Non-zero: check the targets on the device, so that a call never waits
   * for the host (CUDA: no stream synchronization; the call can be captured
   * in a CUDA graph). A target outside [0, V) that is not ignore_index then
   * does not fail the call: osft_flce_compute() returns
   * OSFT_STATUS_SUCCESS, that token's loss (token_loss) and with it the
   * reduced loss (MEAN, SUM) become NaN, the other outputs are computed as
   * if the token had no target in the vocabulary, and the handle keeps a
   * sticky record of the first such call, token and target, which
   * osft_flce_check_targets() reports later (the way a device-side assert
   * of PyTorch surfaces at a later synchronization). The trade-off: the
   * default (0) costs one wait per call (the host reads the check's result
   * before any output is written) and in exchange fails with
   * OSFT_STATUS_INDEX_OUT_OF_RANGE writing nothing. The CPU honours the
   * option with the same semantics (it never waits anyway). With vocab
   * parallelism over more than one rank the ranks exchange their totals on
   * the host, so the call waits and checks there as by default (the option
   * has no effect). Added in 1.1.0; default 0. */
  int device_target_check;
  /** Token chunks or vocabulary slices (osft_flce_chunking_t); the plan a
   * call took is in osft_flce_plan_t::chunking. Under vocab parallelism each
   * rank plans its own shard (the ranks may differ). Added in 1.2.0;
   * default OSFT_FLCE_CHUNKING_AUTO (0). */
  osft_flce_chunking_t chunking;
  /** The vocabulary plan: at most this many classes per slice (exactly this
   * many, the last slice excepted, when the budget allows); 0: as many as
   * the budget allows, balanced over the slices. Must be >= 0; not used by
   * the token plan. Added in 1.2.0; default 0. */
  int64_t slice_cols;
} osft_flce_options_t;

/**
 * @brief Fills *opts with the defaults above for a struct of struct_size
 * bytes.
 *
 * @param[out] opts         The options to fill.
 * @param[in]  struct_size  sizeof(*opts) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS              The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT     (NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_flce_options_init(osft_flce_options_t *opts,
                                              size_t struct_size);
#define OSFT_FLCE_OPTIONS_INIT(o) osft_flce_options_init((o), sizeof(*(o)))

/**
 * @brief Creates a handle with the given options (copied; `opts` may be NULL
 * for the defaults).
 *
 * The handle holds no device memory.
 *
 * @param[in]  ctx   The context the handle belongs to.
 * @param[in]  opts  The options, or NULL for the defaults; only read during
 *                   the call.
 * @param[out] flce  Receives the new handle.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (*flce untouched).
 * @retval OSFT_STATUS_SUCCESS  The handle was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx); (comm not a live communicator).
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (flce NULL; label_smoothing outside
 *   [0, 1]; z_loss_scale negative or not finite; softcap negative or not
 *   finite; unknown reduction, accumulator or chunking; chunk_rows < 0;
 *   slice_cols < 0; vocab_offset < 0; vocab_offset or vocab_size_global not
 *   0 without comm; vocab_size_global <= vocab_offset with a comm of more than one rank;
 *   vocab_offset not 0 or vocab_size_global negative with a one-rank comm;
 *   comm on another context)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_flce_create(osft_context_t ctx,
                                        const osft_flce_options_t *opts,
                                        osft_flce_t *flce);

/**
 * @brief Destroys a handle. NULL is accepted.
 *
 * @param[in] flce  The handle, or NULL.
 * @retval OSFT_STATUS_SUCCESS         Destroyed (or NULL).
 * @retval OSFT_STATUS_INVALID_HANDLE  (not a live handle)
 */
OSFT_API osft_status_t osft_flce_destroy(osft_flce_t flce);

/**
 * @brief Writes the handle's options (as read at creation, with struct_size =
 * opts->struct_size) to *opts, whose struct_size the caller has set.
 *
 * @param[in]     flce  The handle.
 * @param[in,out] opts  In: struct_size set by the caller; out: the options.
 * @retval OSFT_STATUS_SUCCESS              The options were written.
 * @retval OSFT_STATUS_INVALID_HANDLE       flce is not a live handle.
 * @retval OSFT_STATUS_INVALID_ARGUMENT     (opts NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 */
OSFT_API osft_status_t osft_flce_get_options(osft_flce_t flce, osft_flce_options_t *opts);

/**
 * @brief The inputs of a call.
 *
 * Every tensor is on the context's device and only
 * read. M is the number of tokens: the product of x's leading dims.
 */
typedef struct osft_flce_inputs_s {
  size_t struct_size; /**< sizeof(osft_flce_inputs_t) as compiled */
  /** (..., H), fp32 or bf16; rows may be padded. Required. */
  const DLTensor *x;
  /** (V, H), x's dtype; rows may be padded. Required. */
  const DLTensor *weight;
  /** (...), int32 or int64, compact, x's leading dims (a 1-D x, one token,
   * takes a 0-d target). Required. */
  const DLTensor *targets;
  /** (V), fp32 or x's dtype, compact. Optional (NULL: no bias). */
  const DLTensor *bias;
  /** (V), fp32, compact: class weights w (see the formulas above), read on
   * every call; values are not checked (use non-negative ones). Optional
   * (NULL: all 1). */
  const DLTensor *class_weight;
  /** The upstream gradient dL_total/dloss, fp32, folded into the gradient
   * scale (no extra pass over the gradients). MEAN and SUM: one element
   * (shape [] or [1]); NONE: targets' shape, one per token. Read on the
   * device, so it may be the output of earlier device work. Optional
   * (NULL: 1). Not used without gradient outputs. */
  const DLTensor *grad_loss;
} osft_flce_inputs_t;

/**
 * @brief Fills *in with NULL tensors for a struct of struct_size bytes.
 *
 * @param[out] in           The inputs struct to fill.
 * @param[in]  struct_size  sizeof(*in) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS              The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT     in is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_flce_inputs_init(osft_flce_inputs_t *in, size_t struct_size);
#define OSFT_FLCE_INPUTS_INIT(i) osft_flce_inputs_init((i), sizeof(*(i)))

/**
 * @brief The outputs of a call; a NULL tensor is not computed.
 *
 * At least one must
 * be given. Without grad_x, grad_weight and grad_bias the call runs
 * forward-only: no gradient is formed and no backward GEMM runs.
 * Outputs must not overlap each other or any input.
 */
typedef struct osft_flce_outputs_s {
  size_t struct_size; /**< sizeof(osft_flce_outputs_t) as compiled */
  /** fp32. MEAN and SUM: one element (shape [] or [1]); NONE: targets'
   * shape (0 for ignored tokens). */
  DLTensor *loss;
  /** (..., H), x's dtype and leading dims; rows may be padded. */
  DLTensor *grad_x;
  /** (V, H), fp32 or x's dtype; rows may be padded. */
  DLTensor *grad_weight;
  /** (V), fp32 or x's dtype, compact. */
  DLTensor *grad_bias;
  /** fp32, shaped like loss: the z-loss part of the loss (lambda * lse^2
   * per token; MEAN: its sum over N, the tokens not ignored, never over D;
   * SUM: its sum; NONE: per token, 0 for ignored tokens). */
  DLTensor *z_loss;
  /** fp32, one element: the fraction of the tokens not ignored whose
   * argmax equals the target (unweighted; 0 when every token is ignored). */
  DLTensor *accuracy;
  /** targets' shape, int32 or int64: the index of the largest (softcapped)
   * logit of every token, ignored ones included; the lowest index on ties. */
  DLTensor *argmax;
  /** targets' shape, fp32: the per-token loss before reduction and before
   * the upstream gradient (0 for ignored tokens), whatever the reduction. */
  DLTensor *token_loss;
  /** OR of OSFT_FLCE_ACCUMULATE_*: add the gradient into the existing values
   * (beta = 1, e.g. over micro-batches) instead of overwriting. Default 0. */
  uint32_t accumulate;
} osft_flce_outputs_t;

/** @brief osft_flce_outputs_t::accumulate bit: add into grad_x. */
#define OSFT_FLCE_ACCUMULATE_GRAD_X (1u << 0)
/** @brief osft_flce_outputs_t::accumulate bit: add into grad_weight. */
#define OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT (1u << 1)
/** @brief osft_flce_outputs_t::accumulate bit: add into grad_bias. */
#define OSFT_FLCE_ACCUMULATE_GRAD_BIAS (1u << 2)
/** @brief Every osft_flce_outputs_t::accumulate bit. */
#define OSFT_FLCE_ACCUMULATE_ALL (0x7u)

/**
 * @brief Fills *out with NULL tensors and accumulate = 0.
 *
 * @param[out] out          The outputs struct to fill.
 * @param[in]  struct_size  sizeof(*out) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS              The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT     out is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_flce_outputs_init(osft_flce_outputs_t *out,
                                              size_t struct_size);
#define OSFT_FLCE_OUTPUTS_INIT(o) osft_flce_outputs_init((o), sizeof(*(o)))

/**
 * @brief Computes the loss and every requested output in one pass over the
 * tokens (see the top of this file).
 *
 * On CUDA the work is enqueued on the context's
 * stream; the call returns once the target check has come back and the rest
 * is enqueued. Gradients are of the reduced loss times grad_loss.
 *
 * @param[in] flce  The handle.
 * @param[in] in    The inputs (osft_flce_inputs_t).
 * @param[in] out   The outputs to write (osft_flce_outputs_t); the struct is
 *                  only read, the tensors it points to are written.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (nothing is written
 * on failure, accumulators included).
 * @retval OSFT_STATUS_SUCCESS  Every requested output was written (on CUDA:
 *   enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  (flce, or its context was destroyed)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (in or out NULL, a required tensor
 *   NULL, no output requested, unknown accumulate bits); also when
 *   out->grad_x is requested (or typed) differently on different ranks
 *   (every rank fails alike).
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (in, out)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A tensor's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  A tensor's shape; also when the ranks'
 *   shards do not tile [0, vocab_size_global), or the ranks'
 *   vocab_size_global or x shapes differ (every rank fails alike), or a
 *   one-rank comm has a vocab_size_global other than 0 and in->weight's
 *   rows.
 * @retval OSFT_STATUS_BAD_LAYOUT  A tensor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A tensor's device.
 * @retval OSFT_STATUS_ALIASING  (an output overlaps an input or another
 *   output)
 * @retval OSFT_STATUS_INDEX_OUT_OF_RANGE  (a target outside [0, V) that is
 *   not ignore_index; the message names the first such token and its value;
 *   V is the global vocab_size_global with vocab parallelism). Not with
 *   device_target_check (one rank): the call then succeeds with a NaN loss
 *   and osft_flce_check_targets() reports it later.
 * @retval OSFT_STATUS_COMM_ERROR  (a collective failed; the outputs may then
 *   be partly written)
 * @retval OSFT_STATUS_TIMEOUT  (a collective failed; the outputs may then be
 *   partly written)
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (the budget or workspace_limit is below
 *   the minimum for one row, or the allocator failed)
 * @retval OSFT_STATUS_NOT_SUPPORTED  (a dimension beyond the CPU BLAS's 32
 *   bits)
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_flce_compute(osft_flce_t flce, const osft_flce_inputs_t *in,
                                         const osft_flce_outputs_t *out);

/**
 * @brief Reports and clears the sticky target error of a handle created with
 * device_target_check (see osft_flce_options_t): whether a call since the
 * handle was created, or since the last osft_flce_check_targets(), had a
 * target outside [0, V) that is not ignore_index.
 *
 * On CUDA this waits for the context's stream (the work of the calls made
 * so far must have run): call it where a step synchronizes anyway (e.g.
 * when the loss is read), not inside a captured graph. The message names
 * the first such call (counted from 1 since the creation or the last
 * check), its token and its target. A handle without device_target_check
 * has no record and always returns OSFT_STATUS_SUCCESS (its calls fail
 * at once instead). Added in 1.1.0.
 *
 * @param[in] flce  The handle.
 * @retval OSFT_STATUS_SUCCESS  No out-of-range target since the last check.
 * @retval OSFT_STATUS_INDEX_OUT_OF_RANGE  A call had one (the message says
 *   which call, token and target); the record is cleared.
 * @retval OSFT_STATUS_INVALID_HANDLE  (flce, or its context was destroyed)
 * @retval OSFT_STATUS_BACKEND_ERROR  Waiting for the stream or reading the
 *   record failed (the CUDA error's name is in the message).
 * @par Thread safety
 * As for osft_flce_compute(): one thread at a time per context.
 */
OSFT_API osft_status_t osft_flce_check_targets(osft_flce_t flce);

/**
 * @brief What a call would do, from osft_flce_get_plan().
 *
 * The caller sets
 * struct_size; fields beyond it are not written.
 */
typedef struct osft_flce_plan_s {
  size_t struct_size;     /**< set by the caller: sizeof as compiled */
  int64_t tokens;         /**< M */
  int64_t chunk_rows;     /**< tokens per chunk (the last may have fewer) */
  int64_t chunks;         /**< number of chunks (0 when M is 0) */
  uint64_t scratch_bytes; /**< workspace the call takes */
  uint64_t budget_bytes;  /**< the bound it was planned against */
  /** The plan chosen: OSFT_FLCE_CHUNKING_TOKENS or OSFT_FLCE_CHUNKING_VOCAB
   * (never AUTO). With VOCAB, chunk_rows and chunks are the token tiles.
   * Added in 1.2.0. */
  osft_flce_chunking_t chunking;
  /** Vocabulary slices per token tile (1 for the token plan). Added in
   * 1.2.0. */
  int64_t slices;
  /** Classes per slice (the last may have fewer; V for the token plan).
   * Added in 1.2.0. */
  int64_t slice_cols;
} osft_flce_plan_t;

/**
 * @brief Fills *plan with zeros for a struct of struct_size bytes and sets
 * plan->struct_size = struct_size, ready for osft_flce_get_plan().
 *
 * Pass sizeof(osft_flce_plan_t), or use OSFT_FLCE_PLAN_INIT(&s).
 * Added in 1.3.0 (before, callers set struct_size by hand).
 *
 * @param[out] plan  The struct to fill.
 * @param[in]  struct_size  sizeof(*plan) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The struct was filled.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  plan is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_flce_plan_init(osft_flce_plan_t *plan, size_t struct_size);
#define OSFT_FLCE_PLAN_INIT(p) osft_flce_plan_init((p), sizeof(*(p)))

/**
 * @brief Validates `in` and `out` as osft_flce_compute() would (except the
 * target values, which stay on the device) and describes the call in *plan.
 *
 * Computes and writes nothing else; with vocab parallelism it plans this
 * rank alone (no collective), and the call then chunks with the fewest rows
 * over the ranks.
 *
 * @param[in]     flce  The handle.
 * @param[in]     in    The inputs the call would take.
 * @param[in]     out   The outputs the call would take (not written).
 * @param[in,out] plan  In: struct_size set by the caller; out: the plan.
 * @return Errors: as for osft_flce_compute, plus
 * OSFT_STATUS_INVALID_ARGUMENT (plan NULL) and
 * OSFT_STATUS_INVALID_STRUCT_SIZE (plan), minus
 * OSFT_STATUS_INDEX_OUT_OF_RANGE.
 * @retval OSFT_STATUS_SUCCESS  *plan was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  As for osft_flce_compute().
 * @retval OSFT_STATUS_INVALID_ARGUMENT  As for osft_flce_compute(), and plan
 *   NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  As for osft_flce_compute(), and
 *   plan->struct_size.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  As for osft_flce_compute().
 * @retval OSFT_STATUS_SHAPE_MISMATCH  As for osft_flce_compute().
 * @retval OSFT_STATUS_BAD_LAYOUT  As for osft_flce_compute().
 * @retval OSFT_STATUS_DEVICE_MISMATCH  As for osft_flce_compute().
 * @retval OSFT_STATUS_ALIASING  As for osft_flce_compute().
 * @retval OSFT_STATUS_OUT_OF_MEMORY  As for osft_flce_compute().
 */
OSFT_API osft_status_t osft_flce_get_plan(osft_flce_t flce, const osft_flce_inputs_t *in,
                                          const osft_flce_outputs_t *out,
                                          osft_flce_plan_t *plan);

/**
 * @def OSFT_FLCE_OPTIONS_INIT(o)
 * @brief osft_flce_options_init() with the struct's own size.
 * @param o  Pointer to an osft_flce_options_t.
 */

/**
 * @def OSFT_FLCE_INPUTS_INIT(i)
 * @brief osft_flce_inputs_init() with the struct's own size.
 * @param i  Pointer to an osft_flce_inputs_t.
 */

/**
 * @def OSFT_FLCE_OUTPUTS_INIT(o)
 * @brief osft_flce_outputs_init() with the struct's own size.
 * @param o  Pointer to an osft_flce_outputs_t.
 */

/**
 * @def OSFT_FLCE_PLAN_INIT(p)
 * @brief osft_flce_plan_init() with the struct's own size.
 * @param p  Pointer to an osft_flce_plan_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_FLCE_H */
