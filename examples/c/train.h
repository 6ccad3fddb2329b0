/*
 * osftrt_train — shared declarations of the continual fine-tuning example.
 *
 *   train_data.c   the two tasks (text files), batches, a seeded RNG
 *   train_model.c  the byte-level LM: embedding glue and RMSNorm in plain C,
 *                  projections as dense weights (CBLAS) or libosftrt OSFT
 *                  layers, tiled SwiGLU MLPs, fused linear cross-entropy
 *   train_optim.c  AdamW and SOAP (eigenbases refreshed by batched osft_qr
 *                  power iteration)
 *   train_device.c mirrored host/device buffers around the library calls
 *   train_checkpoint.c  --save / --resume: the checkpoint file (format, atomic
 *                  write, checks) and what it holds
 *   osftrt_train.c flags, the experiment, the table
 *
 * The trainer's own math runs on the CPU over host memory; libosftrt runs
 * on the context's device (--device: a CUDA GPU when one is present, else
 * the CPU), over the device side of mirrored buffers (dbuf_t) that the
 * trainer copies around each library call. On the CPU the two sides are
 * one buffer and nothing is copied.
 */
#ifndef OSFTRT_TRAIN_H
#define OSFTRT_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/osftrt.h"

/* Stops the program with a clear message when a libosftrt call fails; the
 * call runs with device memory open (see dev_guard_open). */
#define CHECK(call) \
  (dev_guard_open(), train_check((call), #call, __FILE__, __LINE__), dev_guard_close())
void train_check(osft_status_t st, const char *what, const char *file, int line);
/* Stops the program with a message (not a library error). */
void train_fail(const char *fmt, ...);
void *xcalloc(size_t count, size_t size);

/* ------------------------------------------------------------- data */

typedef struct {
  uint64_t s;
} rng_t;
void rng_seed(rng_t *r, uint64_t seed);
uint64_t rng_next(rng_t *r);
double rng_uniform(rng_t *r); /* [0, 1) */
double rng_normal(rng_t *r);

typedef struct {
  const char *name;
  unsigned char *bytes;
  int64_t size;
  int64_t train_end; /* [0, train_end) trains, [train_end, size) evaluates */
} corpus_t;
void corpus_load(corpus_t *c, const char *name, const char *path);
void corpus_free(corpus_t *c);

/* One batch of `tokens` examples: the k context bytes of each (tokens x k)
 * and its target byte. */
typedef struct {
  int64_t tokens, k;
  unsigned char *context;
  int64_t *targets;
} batch_t;
void batch_alloc(batch_t *b, int64_t tokens, int64_t k);
void batch_free(batch_t *b);
/* `sequences` windows of `seq` consecutive tokens at random places of the
 * training part. */
void batch_sample(batch_t *b, const corpus_t *c, rng_t *r, int64_t sequences,
                  int64_t seq);
/* Tokens [first, first + b->tokens) of the held-out part, consecutive. */
void batch_eval(batch_t *b, const corpus_t *c, int64_t first);

/* ------------------------------------------------------------ model */

enum { MAX_BLOCKS = 8, VOCAB = 256 };

typedef struct {
  int64_t k;      /* context bytes */
  int64_t e;      /* embedding width per byte */
  int64_t h;      /* hidden width = k * e */
  int64_t inter;  /* MLP intermediate width */
  int64_t blocks; /* residual blocks */
} dims_t;

/* The dense weights (the checkpoint that pre-training produces and each
 * fine-tuning starts from). */
typedef struct {
  float *emb;               /* VOCAB x e */
  float *norm1[MAX_BLOCKS]; /* h */
  float *mix[MAX_BLOCKS];   /* h x h: the block's projection */
  float *norm2[MAX_BLOCKS]; /* h */
  float *gate[MAX_BLOCKS];  /* inter x h */
  float *up[MAX_BLOCKS];    /* inter x h */
  float *down[MAX_BLOCKS];  /* h x inter */
  float *normf;             /* h */
  float *head;              /* VOCAB x h */
} weights_t;
void weights_alloc(weights_t *w, const dims_t *d);
void weights_init(weights_t *w, const dims_t *d, rng_t *r);
void weights_copy(weights_t *dst, const weights_t *src, const dims_t *d);
void weights_free(weights_t *w, const dims_t *d);

/* One array of a weights_t, named ("emb", "block0.mix", ..., "head");
 * `projection`: a block projection or the head (an OSFT layer in OSFT
 * mode), else the embedding or a norm's gain. */
typedef struct {
  char name[32];
  float *data;
  int64_t rows, cols; /* compact; vectors are 1 x n */
  int projection;
} wtensor_t;
enum { MAX_WTENSORS = 3 + 6 * MAX_BLOCKS };
/* Every array of *w, in a fixed order; returns the count. */
int weights_list(const weights_t *w, const dims_t *d, wtensor_t *out);

/* A DLTensor over host memory (2-D with a row stride, or 1-D). */
typedef struct {
  DLTensor t;
  int64_t shape[2];
  int64_t strides[2];
} tview_t;
void tview_mat(tview_t *v, float *data, int64_t rows, int64_t cols, int64_t ld);
void tview_vec(tview_t *v, float *data, int64_t n);

/* ----------------------------------------------------------- device */

typedef enum {
  DEV_HOST = 0,   /* CPU context; dev == host, no copies */
  DEV_STAGED = 1, /* CPU context; dev a separate host copy (tests staging) */
  DEV_CUDA = 2    /* CUDA context; dev is GPU memory */
} dev_mode_t;
/* Chosen once, before any buffer or context is made. */
void dev_select(dev_mode_t mode);
dev_mode_t dev_current(void);
osft_device_type_t dev_context_type(void);
/* Raw device bytes (not in DEV_HOST), zeroed; and a host -> dev copy. */
void *dev_malloc_bytes(size_t bytes);
void dev_free_bytes(void *p, size_t bytes);
void dev_upload_bytes(void *dev, const void *host, size_t bytes);
/* DEV_STAGED: device memory is readable only between dev_guard_open() and
 * dev_guard_close() (nested; CHECK and the copies do this), so host code
 * that touches it faults as it would on a GPU. No-ops in the other modes. */
void dev_guard_open(void);
void dev_guard_close(void);

/* A rows x cols float matrix (row stride ld) with a host side for the
 * trainer's C code and a device side for libosftrt. In DEV_HOST they are
 * the same memory and the copies do nothing. */
typedef struct {
  float *host;
  void *dev;
  int64_t rows, cols, ld;
  size_t bytes; /* of the device side's span */
  int own_host, own_dev;
} dbuf_t;
/* A new zeroed matrix (ld = cols), both sides. */
void dbuf_alloc(dbuf_t *b, int64_t rows, int64_t cols);
/* A device side for existing host memory (contents not copied). */
void dbuf_mirror_host(dbuf_t *b, float *host, int64_t rows, int64_t cols, int64_t ld);
/* A host side for device memory the library owns (downloaded now). */
void dbuf_mirror_dev(dbuf_t *b, void *dev, int64_t rows, int64_t cols, int64_t ld);
void dbuf_free(dbuf_t *b);
void dbuf_upload(const dbuf_t *b);   /* host -> dev */
void dbuf_download(const dbuf_t *b); /* dev -> host */
void dbuf_upload_rows(const dbuf_t *b, int64_t rows);
void dbuf_download_rows(const dbuf_t *b, int64_t rows);
/* A tensor over the device side: its first `rows` rows; or 1-D (rows 1). */
void tview_dev(tview_t *v, const dbuf_t *b, int64_t rows);
void tview_dev_vec(tview_t *v, const dbuf_t *b);

/* A trainable tensor: a rows x cols matrix (row stride ld) or a vector
 * (rows = 1), its compact gradient and the optimizer's state. */
typedef struct {
  const char *name;
  float *data;
  int64_t rows, cols, ld;
  float *grad;
  int matrix; /* 2-D: SOAP preconditions it */
  int decay;  /* AdamW weight decay applies */
  /* the device sides libosftrt uses, when there are (else NULL): data and
   * grad are their host sides */
  dbuf_t *data_dev, *grad_dev;
  /* optimizer state, allocated by the optimizer */
  float *m, *v;
  float *l, *r, *ql, *qr; /* SOAP: Kronecker factors and their eigenbases */
} param_t;

enum { MAX_PARAMS = 128 };

/* One OSFT projection: the layer and its factor gradients. */
typedef struct {
  osft_flinear_t layer;
  int64_t n, k, r, l;
  dbuf_t du, ds, dv;          /* factor gradients, compact: n x l, l, l x k */
  tview_t du_t, ds_t, dv_t;   /* their device tensors */
  osft_flinear_grads_t grads; /* for the MLP and the layer's backward */
  dbuf_t u_low, s_low, v_low; /* the trainable factors: library memory and
                                 host mirrors */
} osft_proj_t;

typedef struct {
  dims_t d;
  int osft; /* 0: every weight dense and trainable; 1: OSFT fine-tuning */
  osft_context_t ctx;
  weights_t w; /* dense: trained; OSFT: embedding and norms (frozen) */
  weights_t g; /* dense gradients (dense mode) */
  /* dense mode: device sides of the MLP weights, the head and their
   * gradients (gate, up, down) */
  dbuf_t mlp_wd[MAX_BLOCKS][3], mlp_gd[MAX_BLOCKS][3], head_wd, head_gd;
  /* OSFT mode */
  osft_proj_t mix_p[MAX_BLOCKS], gate_p[MAX_BLOCKS], up_p[MAX_BLOCKS], down_p[MAX_BLOCKS],
      head_p;
  dbuf_t head_merged; /* VOCAB x h: the head merged for the loss */
  dbuf_t head_grad;   /* VOCAB x h: its dense gradient */
  float *head_tmp;    /* VOCAB x l scratch */
  osft_comm_t comm;
  osft_projector_t proj;
  /* library handles */
  osft_mlp_t mlp[MAX_BLOCKS];
  osft_flce_t ce;
  tview_t mlp_w[MAX_BLOCKS][3];
  /* activations for up to max_tokens tokens; dbuf_t: what the library
   * reads or writes */
  int64_t max_tokens;
  float *x[MAX_BLOCKS + 1], *xm[MAX_BLOCKS];
  dbuf_t a1[MAX_BLOCKS], a2[MAX_BLOCKS], fin, dfin, dx, dxm, dtmp;
  float *rstd1[MAX_BLOCKS], *rstd2[MAX_BLOCKS], *rstdf;
  dbuf_t loss;       /* 1 float */
  void *targets_dev; /* max_tokens int64 (not in DEV_HOST) */
  /* trainable tensors */
  param_t params[MAX_PARAMS];
  int nparams;
} model_t;

typedef struct {
  double rank_ratio;  /* OSFT: frozen fraction of each projection's rank */
  size_t tile_budget; /* MLP: bytes of one tile's intermediates */
  size_t loss_budget; /* fused cross-entropy: scratch bytes */
  int64_t max_tokens; /* the most tokens one call sees */
} model_options_t;

void model_create(model_t *m, osft_context_t ctx, const dims_t *d, const weights_t *from,
                  int osft, const model_options_t *o);
/* A host mirror (dbuf_mirror_dev, downloaded now) of one factor of a layer
 * (library memory); dbuf_upload writes it back, dbuf_free releases it. */
void factor_mirror(osft_flinear_t layer, osft_flinear_factor_t which, dbuf_t *b);
void model_destroy(model_t *m);
/* Mean cross-entropy (nats per byte) of a batch; with `train` also every
 * trainable gradient, on the device side (OSFT: the factor gradients, not
 * yet projected). */
double model_step(model_t *m, const batch_t *b, int train);
/* Gradients, device -> host sides (for the optimizer). */
void model_grads_to_host(const model_t *m);
/* Parameters, host -> device sides (after the optimizer changed them). */
void model_params_to_dev(const model_t *m);
/* Parameters, device -> host sides (after the library changed them). */
void model_params_to_host(const model_t *m);
/* Mean loss over `tokens` held-out tokens, in batches of m->max_tokens. */
double model_eval(model_t *m, const corpus_t *c, int64_t tokens);
int64_t model_trainable(const model_t *m);

/* -------------------------------------------------------- optimizer */

typedef enum { OPT_ADAMW = 0, OPT_SOAP = 1 } opt_kind_t;

typedef struct {
  opt_kind_t kind;
  double lr, beta1, beta2, eps, weight_decay;
  double shampoo_beta; /* SOAP: EMA of the Kronecker factors */
  int refresh_every;   /* SOAP: eigenbasis refresh period (steps) */
  int init_iterations; /* SOAP: power iterations of the first basis */
  int64_t max_precond; /* SOAP: larger sides are not rotated */
  osft_context_t ctx;
  param_t **params;
  int nparams;
  int64_t step;
  double qr_seconds; /* time spent in osft_qr_power_iteration */
  int64_t qr_calls, qr_matrices;
  float *scratch[3]; /* the size of the largest tensor */
} optimizer_t;

void optimizer_init(optimizer_t *o, osft_context_t ctx, param_t *params, int nparams);
/* One update with learning rate `lr` from the gradients in params[i].grad. */
void optimizer_step(optimizer_t *o, double lr);
void optimizer_free(optimizer_t *o);
/* Bytes of optimizer state. */
size_t optimizer_state_bytes(const optimizer_t *o);

/* Dense GEMM of the trainer's own math (CBLAS, row-major):
 * C = alpha op(A) op(B) + beta C. */
void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
          int64_t ldc);

double now_seconds(void);

/* ------------------------------------------------------- experiment */

typedef struct {
  int64_t pretrain_steps, steps, batch, seq;
  double rank_ratio;
  uint64_t seed;
  opt_kind_t opt;
  size_t tile_budget, loss_budget;
  double lr, ft_lr;
  int64_t log_every, eval_every, eval_tokens;
  int refresh_every;
  const char *data_dir;
  int check;
  int grad_check;
  int print_losses;
  const char *device; /* auto, cpu, cuda or staged */
  double check_ratio; /* --check: OSFT's task-A rise < ratio x full's */
  dims_t d;
  /* checkpoints (train_checkpoint.c) */
  const char *save_dir;    /* --save: NULL for none */
  int64_t save_every;      /* --save-every: 0 = only at the end */
  const char *resume_dir;  /* --resume */
  const char *inspect_dir; /* --inspect */
  int64_t stop_after;      /* --stop-after: 0 = run to the end */
} config_t;

/* The three phases of the experiment, in order; a checkpoint names the
 * one it was written in. */
enum { PHASE_PRETRAIN = 0, PHASE_FULL = 1, PHASE_OSFT = 2, PHASES = 3 };

enum { MAX_EVALS = 1024 };

/* What a phase reports (one row of the results). */
typedef struct {
  const char *name;
  int64_t trainable;
  double a_before, b_before, a_after, b_after;
  double first_loss, last_loss; /* training loss, first and last log window */
  double seconds, tokens_per_s, qr_seconds;
  int64_t qr_calls, qr_matrices;
  uint64_t lib_peak;
  size_t state_bytes;
  double orth_max; /* OSFT: the largest residual after any step */
  int nevals;
  int64_t eval_step[MAX_EVALS];
  double eval_a[MAX_EVALS], eval_b[MAX_EVALS];
} run_t;

/* The training loop's own state: where it is and what it has summed. */
typedef struct {
  int phase;
  int64_t step; /* steps of this phase done */
  rng_t rng;    /* the batch sampler's */
  double window_loss, window_time, train_time;
  int64_t window_steps;
} loop_state_t;

/* Everything of the experiment that outlives one phase. */
typedef struct {
  const config_t *c;
  const corpus_t *a, *b;
  weights_t *pretrained; /* the checkpoint the fine-tunings start from */
  run_t *runs[PHASES];
} session_t;

/* Global step (over the three phases) of `step` steps into `phase`. */
int64_t global_step(const config_t *c, int phase, int64_t step);
int64_t total_steps(const config_t *c);

/* ------------------------------------------------------- checkpoint */

/* A checkpoint read into memory with every checksum verified. */
typedef struct checkpoint_s checkpoint_t;

/* Writes DIR/train.ckpt (DIR is created if missing) with everything a
 * resumed run needs: the configuration, the data's digests, the loop
 * state, the runs so far, the pre-trained weights (fine-tuning phases),
 * the model (dense weights; OSFT: the frozen dense tensors and every
 * layer's six factors), the optimizer's state. Atomic: a temporary file
 * in DIR, fsync, rename over the old checkpoint, fsync of DIR. OSFT: then
 * drops every layer's kept W (osft_flinear_refresh), so the next step
 * builds it from the factors as a resumed run does. Stops the program
 * with a message on any I/O error. */
void checkpoint_save(const char *dir, const session_t *s, const loop_state_t *t,
                     model_t *m, const optimizer_t *o);
/* Reads DIR/train.ckpt and verifies its format and every checksum, and
 * that it was written by this configuration on the same data; stops the
 * program with a message naming the file and the field otherwise. */
checkpoint_t *checkpoint_open(const char *dir, const config_t *c, const corpus_t *a,
                              const corpus_t *b);
void checkpoint_close(checkpoint_t *ck);
/* The phase it was written in. */
int checkpoint_phase(const checkpoint_t *ck);
void checkpoint_load_run(const checkpoint_t *ck, int phase, run_t *run);
/* The pre-trained weights (a checkpoint of a fine-tuning phase). */
void checkpoint_load_pretrained(const checkpoint_t *ck, weights_t *w, const dims_t *d);
/* Into a model made by model_create (any weights of the right shapes):
 * its state as saved (OSFT: factors written through the layers' views,
 * then osft_flinear_refresh), and the optimizer's state and the loop's. */
void checkpoint_load_model(const checkpoint_t *ck, model_t *m);
void checkpoint_load_optimizer(const checkpoint_t *ck, optimizer_t *o);
void checkpoint_load_loop(const checkpoint_t *ck, loop_state_t *t);
/* --inspect: verifies DIR/train.ckpt (format and checksums) and lists it;
 * stops the program with a message if it does not read. */
void checkpoint_inspect(const char *dir);
/* CRC32 of the model's state (the tensors a checkpoint holds for it). */
uint32_t model_digest(model_t *m);

#endif /* OSFTRT_TRAIN_H */
