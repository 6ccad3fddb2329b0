/*
 * osftrt_train — continual fine-tuning with libosftrt: OSFT keeps what full
 * fine-tuning forgets.
 *
 * A byte-level language model (train_model.c) is pre-trained on task A
 * (English prose), then fine-tuned on task B (C source code) twice from the
 * same checkpoint, on the same batches:
 *   full  every weight trainable (dense projections);
 *   osft  every projection decomposed by libosftrt (osft_flinear), only the
 *         low singular part trains; one batched projection of all gradients
 *         per step (osft_projector_project) and of all parameters after the
 *         optimizer step (osft_projector_project_params); the orthogonality
 *         residual is checked after every step.
 * The table reports, per method, the task-B loss after fine-tuning, the
 * task-A loss before and after (the forgetting), wall time, tokens/s and the
 * peak memory the library held (osft_context_get_memory_stats); and full
 * fine-tuning's task-A loss at the point where its task-B loss matched
 * OSFT's final one, so the forgetting is compared at equal task-B loss.
 *
 * --device picks where libosftrt runs: on a CUDA GPU when the trainer was
 * built with CUDA and one is visible (auto), else on the CPU; the trainer's
 * own glue and optimizer stay host C code, with copies around each library
 * call (train_device.c). --device staged runs the GPU path's copies between
 * separate host buffers on the CPU, so it is testable without a GPU and
 * must give the same losses, bit for bit, as --device cpu.
 *
 * --save DIR writes a checkpoint (train_checkpoint.c) every --save-every
 * steps and at the end, atomically; --resume DIR continues the run that
 * wrote it, bit for bit (the same losses as a run never stopped, with the
 * same --save-every).
 *
 * Exit status: 0 on success; 1 on bad flags, data or checkpoint; 2 on a libosftrt
 * error (the message names the call and the library's reason); 3 when
 * --check is given and a check failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#ifndef OSFT_TRAIN_DATA_DIR
#define OSFT_TRAIN_DATA_DIR "examples/data"
#endif

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: osftrt_train [flags]\n"
      "  --steps N           fine-tuning steps on task B, each method (default 150)\n"
      "  --pretrain-steps N  pre-training steps on task A (default 300)\n"
      "  --batch N           sequences per step (default 8)\n"
      "  --seq N             tokens per sequence (default 64)\n"
      "  --rank-ratio R      OSFT: frozen fraction of each projection's rank, in\n"
      "                      (0, 1) (default 0.75)\n"
      "  --seed N            seed of the weights and batches (default 1)\n"
      "  --optimizer NAME    adamw or soap (default soap)\n"
      "  --tile-budget B     tiled MLP: bytes of one tile's intermediates (default "
      "256K)\n"
      "  --loss-budget B     fused cross-entropy: scratch bytes (default 128K)\n"
      "  --lr X              pre-training learning rate (default 3e-3)\n"
      "  --ft-lr X           fine-tuning learning rate (default 2e-3)\n"
      "  --refresh N         SOAP: eigenbasis refresh every N steps (default 10)\n"
      "  --context N         context bytes k (default 8)\n"
      "  --embed N           embedding width per byte (default 16; hidden = k x "
      "embed)\n"
      "  --inter N           MLP intermediate width (default 256)\n"
      "  --blocks N          residual blocks (default 2)\n"
      "  --log-every N       progress line every N steps (default 50)\n"
      "  --eval-every N      fine-tuning: evaluate both tasks every N steps (default "
      "25)\n"
      "  --eval-tokens N     held-out tokens per evaluation (default 4096)\n"
      "  --data-dir DIR      where task_a.txt and task_b.txt are (default the\n"
      "                      source tree's examples/data)\n"
      "  --check             exit 3 unless the losses fall, OSFT stays orthogonal\n"
      "                      and OSFT forgets clearly less than full fine-tuning\n"
      "  --check-ratio X     --check: OSFT's task-A rise must be < X times full\n"
      "                      fine-tuning's at equal task-B loss (default 0.5)\n"
      "  --grad-check        instead of the experiment: compare the model's gradients\n"
      "                      (dense and OSFT) with central differences; exit 3 if off\n"
      "  --device D          auto, cpu, cuda or staged (default auto: cuda when built\n"
      "                      with CUDA and a GPU is visible, else cpu; staged: the\n"
      "                      GPU path's copies between separate host buffers, on\n"
      "                      the CPU, for testing)\n"
      "  --print-losses      also print every training and evaluation loss exactly\n"
      "                      (hex), one 'loss-bits' line each, and a CRC32 of each\n"
      "                      phase's final weights ('weights-bits')\n"
      "  --save DIR          write checkpoints to DIR/train.ckpt (DIR created if\n"
      "                      missing), atomically: at the end of the run, and every\n"
      "                      --save-every steps\n"
      "  --save-every N      also save every N steps, counted over the three phases\n"
      "                      (pre-training, full FT, OSFT)\n"
      "  --resume DIR        continue the run that wrote DIR/train.ckpt (same flags;\n"
      "                      the losses are bit for bit those of a run that was never\n"
      "                      stopped, with the same --save-every)\n"
      "  --stop-after N      stop after step N (counted as --save-every), saving\n"
      "                      there with --save: an interruption, for tests\n"
      "  --inspect DIR       verify DIR/train.ckpt (format and every checksum), list\n"
      "                      its tensors, and exit (0 if it reads)\n"
      "Byte sizes take K/M suffixes.\n");
}

static int64_t parse_int(const char *flag, const char *s, int64_t lo) {
  char *end;
  const long long v = strtoll(s, &end, 10);
  if (*end != '\0' || v < lo)
    train_fail("%s: expected an integer >= %lld, got '%s'", flag, (long long)lo, s);
  return v;
}

static double parse_real(const char *flag, const char *s) {
  char *end;
  const double v = strtod(s, &end);
  if (*end != '\0' || !(v > 0))
    train_fail("%s: expected a positive number, got '%s'", flag, s);
  return v;
}

static size_t parse_bytes(const char *flag, const char *s) {
  char *end;
  const double v = strtod(s, &end);
  double scale = 1;
  if (*end == 'K' || *end == 'k')
    scale = 1024, end++;
  else if (*end == 'M' || *end == 'm')
    scale = 1048576, end++;
  if (*end != '\0' || !(v > 0))
    train_fail("%s: expected a byte count, got '%s'", flag, s);
  return (size_t)(v * scale);
}

static void parse_args(config_t *c, int argc, char **argv) {
  memset(c, 0, sizeof *c);
  c->pretrain_steps = 300;
  c->steps = 150;
  c->batch = 8;
  c->seq = 64;
  c->rank_ratio = 0.75;
  c->seed = 1;
  c->opt = OPT_SOAP;
  c->tile_budget = 256 << 10;
  c->loss_budget = 128 << 10;
  c->lr = 3e-3;
  c->ft_lr = 2e-3;
  c->log_every = 50;
  c->eval_every = 10;
  c->eval_tokens = 4096;
  c->refresh_every = 10;
  c->data_dir = OSFT_TRAIN_DATA_DIR;
  c->check_ratio = 0.5;
  c->device = "auto";
  c->d.k = 8;
  c->d.e = 16;
  c->d.inter = 256;
  c->d.blocks = 2;
  for (int i = 1; i < argc; ++i) {
    const char *f = argv[i];
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    if (strcmp(f, "--check") == 0) {
      c->check = 1;
      continue;
    }
    if (strcmp(f, "--grad-check") == 0) {
      c->grad_check = 1;
      continue;
    }
    if (strcmp(f, "--print-losses") == 0) {
      c->print_losses = 1;
      continue;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      train_fail("%s: missing value (or unknown flag)", f);
    }
    const char *v = argv[++i];
    if (strcmp(f, "--steps") == 0)
      c->steps = parse_int(f, v, 1);
    else if (strcmp(f, "--pretrain-steps") == 0)
      c->pretrain_steps = parse_int(f, v, 1);
    else if (strcmp(f, "--batch") == 0)
      c->batch = parse_int(f, v, 1);
    else if (strcmp(f, "--seq") == 0)
      c->seq = parse_int(f, v, 1);
    else if (strcmp(f, "--rank-ratio") == 0)
      c->rank_ratio = parse_real(f, v);
    else if (strcmp(f, "--seed") == 0)
      c->seed = (uint64_t)parse_int(f, v, 0);
    else if (strcmp(f, "--optimizer") == 0) {
      if (strcmp(v, "adamw") == 0)
        c->opt = OPT_ADAMW;
      else if (strcmp(v, "soap") == 0)
        c->opt = OPT_SOAP;
      else
        train_fail("--optimizer: expected adamw or soap, got '%s'", v);
    } else if (strcmp(f, "--tile-budget") == 0)
      c->tile_budget = parse_bytes(f, v);
    else if (strcmp(f, "--loss-budget") == 0)
      c->loss_budget = parse_bytes(f, v);
    else if (strcmp(f, "--lr") == 0)
      c->lr = parse_real(f, v);
    else if (strcmp(f, "--ft-lr") == 0)
      c->ft_lr = parse_real(f, v);
    else if (strcmp(f, "--refresh") == 0)
      c->refresh_every = (int)parse_int(f, v, 1);
    else if (strcmp(f, "--context") == 0)
      c->d.k = parse_int(f, v, 1);
    else if (strcmp(f, "--embed") == 0)
      c->d.e = parse_int(f, v, 1);
    else if (strcmp(f, "--inter") == 0)
      c->d.inter = parse_int(f, v, 2);
    else if (strcmp(f, "--blocks") == 0)
      c->d.blocks = parse_int(f, v, 1);
    else if (strcmp(f, "--log-every") == 0)
      c->log_every = parse_int(f, v, 1);
    else if (strcmp(f, "--eval-every") == 0)
      c->eval_every = parse_int(f, v, 1);
    else if (strcmp(f, "--eval-tokens") == 0)
      c->eval_tokens = parse_int(f, v, 1);
    else if (strcmp(f, "--data-dir") == 0)
      c->data_dir = v;
    else if (strcmp(f, "--check-ratio") == 0)
      c->check_ratio = parse_real(f, v);
    else if (strcmp(f, "--device") == 0)
      c->device = v;
    else if (strcmp(f, "--save") == 0)
      c->save_dir = v;
    else if (strcmp(f, "--save-every") == 0)
      c->save_every = parse_int(f, v, 1);
    else if (strcmp(f, "--resume") == 0)
      c->resume_dir = v;
    else if (strcmp(f, "--stop-after") == 0)
      c->stop_after = parse_int(f, v, 1);
    else if (strcmp(f, "--inspect") == 0)
      c->inspect_dir = v;
    else {
      usage(stderr);
      train_fail("unknown flag %s", f);
    }
  }
  if (!(c->rank_ratio < 1)) train_fail("--rank-ratio must lie in (0, 1)");
  if (c->d.blocks > MAX_BLOCKS) train_fail("--blocks: at most %d", MAX_BLOCKS);
  if (c->stop_after > c->pretrain_steps + 2 * c->steps)
    train_fail("--stop-after %lld: the run has %lld steps", (long long)c->stop_after,
               (long long)(c->pretrain_steps + 2 * c->steps));
  c->d.h = c->d.k * c->d.e;
}

/* ---------------------------------------------------------- running */

static osft_context_t new_context(void) {
  osft_context_options_t o;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = dev_context_type(); /* CUDA: GPU 0, the legacy default stream */
  osft_context_t ctx = NULL;
  CHECK(osft_context_create(&ctx, &o));
  return ctx;
}

static uint64_t peak_bytes(osft_context_t ctx) {
  osft_memory_stats_t s;
  s.struct_size = sizeof s;
  CHECK(osft_context_get_memory_stats(ctx, &s));
  return s.host_peak + s.device_peak;
}

/* Warm-up over the first 5% of the steps, then a cosine down to 10%. */
static double schedule(double base, int64_t step, int64_t steps) {
  const double warm = fmax(1.0, 0.05 * (double)steps);
  const double w = fmin(1.0, (double)(step + 1) / warm);
  return base * w * (0.1 + 0.45 * (1.0 + cos(3.141592653589793 * step / (double)steps)));
}

static void optimizer_setup(optimizer_t *o, const config_t *c, osft_context_t ctx,
                            model_t *m) {
  memset(o, 0, sizeof *o);
  o->kind = c->opt;
  o->beta1 = 0.9;
  o->beta2 = 0.95;
  o->eps = 1e-8;
  o->weight_decay = 0.01;
  o->shampoo_beta = 0.95;
  o->refresh_every = c->refresh_every;
  o->init_iterations = 4;
  o->max_precond = 1024;
  optimizer_init(o, ctx, m->params, m->nparams);
}

/* The update after model_step: OSFT's gradient projection on the device
 * (one batched call), the gradients to the host, the optimizer there, the
 * parameters back to the device; OSFT: their projection (one batched call),
 * back to the host mirrors, and the orthogonality residual. */
static void update(const config_t *c, model_t *m, optimizer_t *o, double lr, int64_t step,
                   run_t *run) {
  if (m->osft) CHECK(osft_projector_project(m->proj));
  model_grads_to_host(m);
  optimizer_step(o, lr);
  model_params_to_dev(m);
  if (!m->osft) return;
  CHECK(osft_projector_project_params(m->proj));
  model_params_to_host(m);
  double ru = 0, rv = 0;
  CHECK(osft_projector_orthogonality(m->proj, &ru, &rv));
  run->orth_max = fmax(run->orth_max, fmax(ru, rv));
  if (c->check && !(fmax(ru, rv) <= 1e-5)) {
    fprintf(stderr,
            "osftrt_train: check failed: orthogonality residual %.2e (U) %.2e (V) "
            "after step %lld\n",
            ru, rv, (long long)step + 1);
    exit(3);
  }
}

/* The three phases: pre-training (dense, task A, from random weights), then
 * from its weights full fine-tuning and OSFT on task B, on the same
 * batches. */
typedef struct {
  const char *label; /* of the progress and loss-bits lines */
  const char *title;
  const char *run_name;
  int osft;
  int track; /* fine-tuning: evaluate both tasks every eval_every steps */
} phase_def_t;

static const phase_def_t phase_defs[PHASES] = {
    {"pretrain", "pre-training the dense model on task A", "pre-train (dense)", 0, 0},
    {"full-ft", "fine-tuning on task B: full", "full fine-tuning", 0, 1},
    {"osft", "fine-tuning on task B: OSFT", "OSFT", 1, 1},
};

static int64_t phase_steps(const config_t *c, int phase) {
  return phase == PHASE_PRETRAIN ? c->pretrain_steps : c->steps;
}

int64_t global_step(const config_t *c, int phase, int64_t step) {
  for (int p = 0; p < phase; ++p) step += phase_steps(c, p);
  return step;
}

int64_t total_steps(const config_t *c) {
  return global_step(c, PHASES, 0);
}

/* After a step: a checkpoint where one is due (every --save-every steps,
 * at --stop-after and at the end of the run), and the stop. */
static void after_step(const session_t *s, const loop_state_t *t, model_t *m,
                       const optimizer_t *o) {
  const config_t *c = s->c;
  const int64_t g = global_step(c, t->phase, t->step);
  const int stop = g == c->stop_after;
  if (c->save_dir != NULL &&
      ((c->save_every > 0 && g % c->save_every == 0) || stop || g == total_steps(c)))
    checkpoint_save(c->save_dir, s, t, m, o);
  if (!stop) return;
  printf("osftrt_train: stopped after step %lld of %lld (--stop-after)%s%s\n",
         (long long)g, (long long)total_steps(c),
         c->save_dir ? "; continue with --resume " : "", c->save_dir ? c->save_dir : "");
  fflush(stdout);
  exit(0);
}

/* Trains `m` from where *t stands to the end of its phase; evaluates both
 * tasks every eval_every steps when the phase tracks them. */
static void train(const session_t *s, model_t *m, optimizer_t *o, loop_state_t *t,
                  run_t *run) {
  const config_t *c = s->c;
  const phase_def_t *pd = &phase_defs[t->phase];
  const corpus_t *task = t->phase == PHASE_PRETRAIN ? s->a : s->b;
  const int64_t steps = phase_steps(c, t->phase);
  const double base_lr = t->phase == PHASE_PRETRAIN ? c->lr : c->ft_lr;
  batch_t bt;
  batch_alloc(&bt, c->batch * c->seq, c->d.k);
  while (t->step < steps) {
    const int64_t step = t->step;
    batch_sample(&bt, task, &t->rng, c->batch, c->seq);
    const double t0 = now_seconds();
    const double loss = model_step(m, &bt, 1);
    update(c, m, o, schedule(base_lr, step, steps), step, run);
    const double dt = now_seconds() - t0;
    if (!isfinite(loss))
      train_fail("%s: the loss is %f at step %lld", pd->label, loss, (long long)step + 1);
    if (c->print_losses)
      printf("loss-bits %s step %lld %a\n", pd->label, (long long)step + 1, loss);
    t->window_loss += loss;
    t->window_time += dt;
    t->train_time += dt;
    t->window_steps++;
    if ((step + 1) % c->log_every == 0 || step + 1 == steps) {
      const double mean = t->window_loss / (double)t->window_steps;
      if (run->first_loss < 0) run->first_loss = mean;
      run->last_loss = mean;
      printf("  %-9s step %5lld/%lld  loss %.4f  %8.0f tok/s\n", pd->label,
             (long long)step + 1, (long long)steps, mean,
             (double)(t->window_steps * bt.tokens) / fmax(t->window_time, 1e-9));
      fflush(stdout);
      t->window_loss = t->window_time = 0;
      t->window_steps = 0;
    }
    if (pd->track && ((step + 1) % c->eval_every == 0 || step + 1 == steps) &&
        run->nevals < MAX_EVALS) {
      run->eval_step[run->nevals] = step + 1;
      run->eval_a[run->nevals] = model_eval(m, s->a, c->eval_tokens);
      run->eval_b[run->nevals] = model_eval(m, s->b, c->eval_tokens);
      if (c->print_losses)
        printf("loss-bits %s eval %lld %a %a\n", pd->label, (long long)step + 1,
               run->eval_a[run->nevals], run->eval_b[run->nevals]);
      run->nevals++;
    }
    t->step = step + 1;
    after_step(s, t, m, o);
  }
  run->seconds = t->train_time;
  run->tokens_per_s = (double)(steps * bt.tokens) / fmax(t->train_time, 1e-9);
  run->qr_seconds = o->qr_seconds;
  run->qr_calls = o->qr_calls;
  run->qr_matrices = o->qr_matrices;
  batch_free(&bt);
}

static model_options_t model_options(const config_t *c) {
  model_options_t mo;
  mo.rank_ratio = c->rank_ratio;
  mo.tile_budget = c->tile_budget;
  mo.loss_budget = c->loss_budget;
  mo.max_tokens = c->batch * c->seq;
  return mo;
}

/* A phase's start without a checkpoint: the loop at step 0 with its batch
 * RNG seeded, the run's "before" losses evaluated. */
static void start_fresh(const session_t *s, int phase, model_t *m, loop_state_t *t,
                        run_t *run) {
  const config_t *c = s->c;
  memset(t, 0, sizeof *t);
  t->phase = phase;
  rng_seed(&t->rng, c->seed * 1000 + (phase == PHASE_PRETRAIN ? 1 : 2));
  run->a_before = model_eval(m, s->a, c->eval_tokens);
  run->b_before = model_eval(m, s->b, c->eval_tokens);
  run->first_loss = -1;
  run->orth_max = 0;
  run->nevals = 0;
  if (phase_defs[phase].track) {
    run->eval_step[0] = 0;
    run->eval_a[0] = run->a_before;
    run->eval_b[0] = run->b_before;
    run->nevals = 1;
  }
}

/* Runs one phase: from the pre-trained weights (pre-training: random
 * ones), or, with `ck`, from the checkpoint written in this phase. */
static void run_phase(session_t *s, int phase, const checkpoint_t *ck) {
  const config_t *c = s->c;
  const phase_def_t *pd = &phase_defs[phase];
  run_t *run = s->runs[phase];
  weights_t init;
  const weights_t *from = s->pretrained;
  if (phase == PHASE_PRETRAIN) {
    rng_t rng;
    rng_seed(&rng, c->seed);
    weights_alloc(&init, &c->d);
    weights_init(&init, &c->d, &rng);
    from = &init;
  }
  osft_context_t ctx = new_context();
  const model_options_t mo = model_options(c);
  const double t0 = now_seconds();
  model_t m;
  model_create(&m, ctx, &c->d, from, pd->osft, &mo); /* OSFT: the SVDs happen here */
  optimizer_t o;
  optimizer_setup(&o, c, ctx, &m);
  loop_state_t t;
  if (ck != NULL) {
    checkpoint_load_model(ck, &m);
    checkpoint_load_optimizer(ck, &o);
    checkpoint_load_loop(ck, &t);
    checkpoint_load_run(ck, phase, run);
  }
  const double setup = now_seconds() - t0;
  if (ck == NULL) start_fresh(s, phase, &m, &t, run);
  run->name = pd->run_name;
  run->trainable = model_trainable(&m);
  train(s, &m, &o, &t, run);
  if (pd->track) {
    run->seconds += setup;
    run->a_after = run->eval_a[run->nevals - 1];
    run->b_after = run->eval_b[run->nevals - 1];
  } else {
    run->a_after = model_eval(&m, s->a, c->eval_tokens);
    run->b_after = model_eval(&m, s->b, c->eval_tokens);
    weights_copy(s->pretrained, &m.w, &c->d);
  }
  if (c->print_losses) printf("weights-bits %s %08x\n", pd->label, model_digest(&m));
  run->lib_peak = peak_bytes(ctx);
  run->state_bytes = optimizer_state_bytes(&o);
  optimizer_free(&o);
  model_destroy(&m);
  if (phase == PHASE_PRETRAIN) weights_free(&init, &c->d);
  CHECK(osft_context_destroy(ctx));
}

/* The experiment's phases, from the start or from --resume's checkpoint
 * (the phases before it restored, not rerun). */
static void run_phases(session_t *s) {
  const config_t *c = s->c;
  checkpoint_t *ck = NULL;
  int first = PHASE_PRETRAIN;
  if (c->resume_dir != NULL) {
    ck = checkpoint_open(c->resume_dir, c, s->a, s->b);
    first = checkpoint_phase(ck);
    loop_state_t t;
    checkpoint_load_loop(ck, &t);
    const int64_t done = global_step(c, first, t.step);
    if (c->stop_after > 0 && c->stop_after <= done)
      train_fail("--stop-after %lld: %s/train.ckpt is already after step %lld",
                 (long long)c->stop_after, c->resume_dir, (long long)done);
    printf("resuming from %s/train.ckpt: %s, after step %lld of %lld\n", c->resume_dir,
           phase_defs[first].run_name, (long long)done, (long long)total_steps(c));
    if (first > PHASE_PRETRAIN) checkpoint_load_pretrained(ck, s->pretrained, &c->d);
    for (int p = 0; p < first; ++p) {
      checkpoint_load_run(ck, p, s->runs[p]);
      s->runs[p]->name = phase_defs[p].run_name;
    }
  }
  for (int p = PHASE_PRETRAIN; p < PHASES; ++p) {
    printf("== %s%s\n", phase_defs[p].title,
           p < first ? " (done before the checkpoint)" : "");
    if (p >= first) run_phase(s, p, p == first ? ck : NULL);
    if (p == PHASE_PRETRAIN)
      printf("  task-A loss %.4f -> %.4f nats/byte (task B: %.4f)\n",
             s->runs[p]->a_before, s->runs[p]->a_after, s->runs[p]->b_after);
  }
  checkpoint_close(ck);
}

/* Full fine-tuning's task-A loss where its task-B loss first reached
 * `target` (linear between evaluations); *step gets where. Returns its final
 * task-A loss (and *step = -1) if it never did. */
static double a_at_b(const run_t *full, double target, double *step) {
  for (int i = 1; i < full->nevals; ++i)
    if (full->eval_b[i] <= target) {
      const double b0 = full->eval_b[i - 1], b1 = full->eval_b[i];
      const double t = b0 > b1 ? (b0 - target) / (b0 - b1) : 1.0;
      *step = (double)full->eval_step[i - 1] +
              t * (double)(full->eval_step[i] - full->eval_step[i - 1]);
      return full->eval_a[i - 1] + t * (full->eval_a[i] - full->eval_a[i - 1]);
    }
  *step = -1;
  return full->eval_a[full->nevals - 1];
}

static double mib(double bytes) {
  return bytes / 1048576.0;
}

/* The largest |grad| entries of a tensor (up to `want`), as indices into
 * the compact gradient. */
static int largest(const param_t *p, int64_t *idx, int want) {
  const int64_t n = p->rows * p->cols;
  int got = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float g = fabsf(p->grad[i]);
    int pos = got < want ? got++ : want;
    if (pos == want && !(g > fabsf(p->grad[idx[want - 1]]))) continue;
    if (pos == want) pos = want - 1;
    while (pos > 0 && g > fabsf(p->grad[idx[pos - 1]])) {
      idx[pos] = idx[pos - 1];
      pos--;
    }
    idx[pos] = i;
  }
  return got;
}

/* Sets one entry of a parameter (host side) and uploads it. */
static void set_entry(const param_t *p, float *x, float value) {
  *x = value;
  if (p->data_dev != NULL) dbuf_upload(p->data_dev);
}

/* Checks the backward of the model, dense and OSFT (the factor gradients
 * before projection), against central differences of the loss on one batch:
 * for the 3 largest gradient entries of every trainable tensor,
 * |fd - grad| <= 3% of the larger plus 2e-4. Returns the exit status. */
static int grad_check(const config_t *c, const corpus_t *text) {
  int bad = 0, checked = 0;
  double worst = 0;
  for (int osft = 0; osft <= 1; ++osft) {
    rng_t rng;
    rng_seed(&rng, c->seed);
    weights_t w;
    weights_alloc(&w, &c->d);
    weights_init(&w, &c->d, &rng);
    osft_context_t ctx = new_context();
    model_options_t mo = model_options(c);
    model_t m;
    model_create(&m, ctx, &c->d, &w, osft, &mo);
    batch_t bt;
    batch_alloc(&bt, c->batch * c->seq, c->d.k);
    batch_sample(&bt, text, &rng, c->batch, c->seq);
    model_step(&m, &bt, 1);
    model_grads_to_host(&m);
    for (int t = 0; t < m.nparams; ++t) {
      const param_t *p = &m.params[t];
      int64_t idx[3];
      const int n = largest(p, idx, 3);
      for (int j = 0; j < n; ++j) {
        float *x = &p->data[(idx[j] / p->cols) * p->ld + idx[j] % p->cols];
        const float keep = *x, h = 3e-3f;
        set_entry(p, x, keep + h);
        const double up = model_step(&m, &bt, 0);
        set_entry(p, x, keep - h);
        const double down = model_step(&m, &bt, 0);
        set_entry(p, x, keep);
        const double fd = (up - down) / (2.0 * (double)h), an = p->grad[idx[j]];
        const double err = fabs(fd - an), tol = 0.03 * fmax(fabs(fd), fabs(an)) + 2e-4;
        worst = fmax(worst, err / tol);
        checked++;
        if (err > tol) {
          bad++;
          printf("  %s %s[%lld]: gradient %.6f, central difference %.6f\n",
                 osft ? "osft" : "dense", p->name, (long long)idx[j], an, fd);
        }
      }
    }
    batch_free(&bt);
    model_destroy(&m);
    weights_free(&w, &c->d);
    CHECK(osft_context_destroy(ctx));
  }
  printf(
      "grad-check: %d entries (dense and OSFT), %d off; worst error %.2f of the "
      "tolerance\n",
      checked, bad, worst);
  return bad ? 3 : 0;
}

/* Chooses where libosftrt runs (--device); returns the visible GPUs. */
static int select_device(const char *want) {
  int gpus = 0;
  CHECK(osft_device_count(OSFT_DEVICE_CUDA, &gpus));
#ifdef OSFTRT_TRAIN_CUDA
  const int built_cuda = 1;
#else
  const int built_cuda = 0;
#endif
  if (strcmp(want, "auto") == 0)
    dev_select(built_cuda && gpus > 0 ? DEV_CUDA : DEV_HOST);
  else if (strcmp(want, "cpu") == 0)
    dev_select(DEV_HOST);
  else if (strcmp(want, "staged") == 0)
    dev_select(DEV_STAGED);
  else if (strcmp(want, "cuda") == 0) {
    if (!built_cuda)
      train_fail("--device cuda: this trainer was built without CUDA (OSFTRT_CUDA=OFF)");
    if (gpus == 0) train_fail("--device cuda: no CUDA GPU is visible");
    dev_select(DEV_CUDA);
  } else {
    train_fail("--device: expected auto, cpu, cuda or staged, got '%s'", want);
  }
  return gpus;
}

static void print_device(int gpus) {
  const dev_mode_t mode = dev_current();
  if (mode == DEV_CUDA)
    printf(
        "device: cuda (GPU 0 of %d; the trainer's own glue and optimizer on the host)\n",
        gpus);
  else if (mode == DEV_STAGED)
    printf(
        "device: staged (CPU context; tensors copied between separate host buffers as "
        "for a GPU; %d CUDA GPU(s) visible)\n",
        gpus);
  else
    printf("device: cpu (%d CUDA GPU(s) visible)\n", gpus);
}

int main(int argc, char **argv) {
  config_t c;
  parse_args(&c, argc, argv);
  if (c.inspect_dir != NULL) {
    checkpoint_inspect(c.inspect_dir);
    return 0;
  }
  const unsigned lib = osft_version();
  if (lib / 10000 != OSFT_VERSION_MAJOR || lib < OSFT_VERSION_NUMBER)
    train_fail("libosftrt %s does not match the headers %d.%d.%d", osft_version_string(),
               OSFT_VERSION_MAJOR, OSFT_VERSION_MINOR, OSFT_VERSION_PATCH);
  const int gpus = select_device(c.device);
  printf("osftrt_train: libosftrt %s (%s)\n", osft_version_string(), osft_build_info());
  print_device(gpus);

  char path_a[4096], path_b[4096];
  snprintf(path_a, sizeof path_a, "%s/task_a.txt", c.data_dir);
  snprintf(path_b, sizeof path_b, "%s/task_b.txt", c.data_dir);
  corpus_t a, b;
  corpus_load(&a, "A (English prose)", path_a);
  corpus_load(&b, "B (C source code)", path_b);
  if (c.grad_check) {
    const int rc = grad_check(&c, &b);
    corpus_free(&a);
    corpus_free(&b);
    return rc;
  }
  printf("task A: %s, %lld bytes (%lld held out)\n", path_a, (long long)a.size,
         (long long)(a.size - a.train_end));
  printf("task B: %s, %lld bytes (%lld held out)\n", path_b, (long long)b.size,
         (long long)(b.size - b.train_end));
  printf(
      "model: context %lld bytes x embed %lld = hidden %lld, %lld blocks (projection + "
      "SwiGLU MLP %lld), vocab %d\n",
      (long long)c.d.k, (long long)c.d.e, (long long)c.d.h, (long long)c.d.blocks,
      (long long)c.d.inter, VOCAB);
  printf(
      "run: seed %llu, optimizer %s, batch %lld x seq %lld = %lld tokens/step, "
      "pre-train %lld steps (lr %g), fine-tune %lld steps (lr %g), OSFT rank ratio %.2f, "
      "tile budget %zu B, loss budget %zu B\n",
      (unsigned long long)c.seed, c.opt == OPT_SOAP ? "SOAP (AdamW on 1-D)" : "AdamW",
      (long long)c.batch, (long long)c.seq, (long long)(c.batch * c.seq),
      (long long)c.pretrain_steps, c.lr, (long long)c.steps, c.ft_lr, c.rank_ratio,
      c.tile_budget, c.loss_budget);
  fflush(stdout);

  const double t_start = now_seconds();
  weights_t ckpt;
  weights_alloc(&ckpt, &c.d);
  run_t pre, full, osft;
  memset(&pre, 0, sizeof pre);
  memset(&full, 0, sizeof full);
  memset(&osft, 0, sizeof osft);
  session_t session = {&c, &a, &b, &ckpt, {&pre, &full, &osft}};
  run_phases(&session);

  double match_step;
  const double a_match = a_at_b(&full, osft.b_after, &match_step);
  const double rise_full = full.a_after - full.a_before;
  const double rise_match = a_match - full.a_before;
  const double rise_osft = osft.a_after - osft.a_before;

  printf("\n## Results (seed %llu, %s; losses in nats/byte on held-out text)\n\n",
         (unsigned long long)c.seed, c.opt == OPT_SOAP ? "SOAP" : "AdamW");
  printf(
      "| method | trainable | task-B loss | task-A loss before -> after | A rise | wall "
      "s | "
      "tok/s | lib peak MiB | opt state MiB |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const run_t *rows[2] = {&full, &osft};
  for (int i = 0; i < 2; ++i) {
    const run_t *r = rows[i];
    printf(
        "| %s | %lld | %.3f -> %.3f | %.3f -> %.3f | %+.3f | %.1f | %.0f | %.2f | %.2f "
        "|\n",
        r->name, (long long)r->trainable, r->b_before, r->b_after, r->a_before,
        r->a_after, r->a_after - r->a_before, r->seconds, r->tokens_per_s,
        mib((double)r->lib_peak), mib((double)r->state_bytes));
  }
  if (match_step >= 0)
    printf(
        "| full FT at OSFT's task-B loss (step %.0f) | | %.3f | %.3f -> %.3f | %+.3f | "
        "| | | |\n",
        match_step, osft.b_after, full.a_before, a_match, rise_match);
  else
    printf("| full FT never reached OSFT's task-B loss %.3f | | | | | | | | |\n",
           osft.b_after);
  printf("\n");
  printf(
      "pre-training: task-A loss %.3f -> %.3f in %lld steps, %.1f s, %.0f tok/s; lib "
      "peak "
      "%.2f MiB\n",
      pre.a_before, pre.a_after, (long long)c.pretrain_steps, pre.seconds,
      pre.tokens_per_s, mib((double)pre.lib_peak));
  double share = rise_match > 0 ? 100.0 * rise_osft / rise_match : 0.0;
  if (fabs(share) < 0.5) share = 0; /* no "-0%" */
  printf(
      "forgetting (task-A rise): full FT %+.3f at the end, %+.3f at OSFT's task-B loss; "
      "OSFT %+.3f (%.0f%% of full FT's at equal task-B loss)\n",
      rise_full, rise_match, rise_osft, share);
  printf(
      "OSFT: largest orthogonality residual after any step %.1e "
      "(max |U_high^T U_low|, |V_low V_high^T|)\n",
      osft.orth_max);
  if (c.opt == OPT_SOAP)
    printf(
        "SOAP eigenbasis refreshes: full FT %lld batched osft_qr_power_iteration calls "
        "of "
        "%.0f Kronecker factors (%.2f s), OSFT %lld calls of %.0f (%.2f s)\n",
        (long long)full.qr_calls,
        full.qr_calls ? (double)full.qr_matrices / (double)full.qr_calls : 0.0,
        full.qr_seconds, (long long)osft.qr_calls,
        osft.qr_calls ? (double)osft.qr_matrices / (double)osft.qr_calls : 0.0,
        osft.qr_seconds);
  printf("total %.1f s\n", now_seconds() - t_start);

  int failed = 0;
  if (c.check) {
    struct {
      int ok;
      const char *what;
    } checks[] = {
        {pre.a_after < pre.a_before - 0.5,
         "pre-training lowers the held-out task-A loss by > 0.5"},
        {full.b_after < full.b_before - 0.1,
         "full fine-tuning lowers the held-out task-B loss by > 0.1"},
        {osft.b_after < osft.b_before - 0.1,
         "OSFT lowers the held-out task-B loss by > 0.1"},
        {pre.last_loss < pre.first_loss, "pre-training's training loss falls"},
        {osft.orth_max <= 1e-5, "OSFT orthogonality residual <= 1e-5 after every step"},
        {match_step >= 0, "full fine-tuning reaches OSFT's task-B loss"},
        {rise_match > 0 && rise_osft < c.check_ratio * rise_match,
         "OSFT's task-A rise < check-ratio x full FT's at equal task-B loss"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; ++i) {
      printf("check: %s: %s\n", checks[i].what, checks[i].ok ? "ok" : "FAILED");
      failed |= !checks[i].ok;
    }
  }
  weights_free(&ckpt, &c.d);
  corpus_free(&a);
  corpus_free(&b);
  if (failed) {
    fprintf(stderr, "osftrt_train: a check failed\n");
    return 3;
  }
  printf("osftrt_train: done\n");
  return 0;
}
