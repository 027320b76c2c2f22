/*
 * specinfer.h — the public C ABI of specinfer.
 *
 * specinfer makes language-model decoding on the CPU faster by speculative decoding without
 * changing what the model says: a cheap *drafter* proposes tokens, the *target* scores them all
 * in one batched pass, and a *coupler* decides which to keep.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *  - Every call that can fail returns a specinfer_status. SPECINFER_OK is 0.
 *  - Functions that create an object take an optional `char **errmsg`. On failure, when errmsg is
 *    not NULL, *errmsg receives a message that the caller frees with specinfer_free() (or NULL
 *    when the memory for the message itself is refused). On success *errmsg is set to NULL.
 *    Once an object exists, its last error is read with *_errmsg(handle).
 *  - The caller owns what it passes in; objects the library creates are freed by their *_destroy,
 *    and destroying NULL is a no-op.
 *  - Parameter and result structs carry their size as the first field and have an initializer;
 *    fields are only ever appended.
 *  - No C++ exception crosses this boundary and no function aborts on bad input.
 *  - Thread safety: a registry may be used from several threads at once. A target, a drafter, a
 *    constraint and a session are used by one thread at a time (a constraint set on a session
 *    belongs to the session's thread); different sessions run concurrently, also when
 *    their targets share one loaded model (specinfer_target_share). Creating a session claims
 *    its target and drafter atomically: of several threads creating sessions on one target at
 *    once, one succeeds and the others get STATE. Couplers and sketchers are immutable after
 *    creation and may be shared freely. Checked under ThreadSanitizer (docs/RELIABILITY.md).
 */
#ifndef SPECINFER_H
#define SPECINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SPECINFER_BUILDING_LIBRARY)
#define SPECINFER_API __attribute__((visibility("default")))
#else
#define SPECINFER_API
#endif

#if defined(__GNUC__)
#define SPECINFER_DEPRECATED(hint) __attribute__((deprecated(hint)))
#else
#define SPECINFER_DEPRECATED(hint)
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

#define SPECINFER_VERSION_MAJOR 0
#define SPECINFER_VERSION_MINOR 1
#define SPECINFER_VERSION_PATCH 0
#define SPECINFER_VERSION_STRING "0.1.0"
/* MAJOR * 1000000 + MINOR * 1000 + PATCH. */
#define SPECINFER_VERSION_NUMBER \
  (SPECINFER_VERSION_MAJOR * 1000000 + SPECINFER_VERSION_MINOR * 1000 + SPECINFER_VERSION_PATCH)

/* The version of the library actually loaded; compare with SPECINFER_VERSION_NUMBER to check that
 * header and library agree. Never fails; thread-safe. */
SPECINFER_API int specinfer_version_number(void);
/* The same as a static string, e.g. "0.1.0". */
SPECINFER_API const char *specinfer_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------------------------- */

typedef enum specinfer_status {
  SPECINFER_OK = 0,
  SPECINFER_ERR_INVALID_ARGUMENT = 1, /* NULL where a value is needed, bad size, NaN, ... */
  SPECINFER_ERR_OUT_OF_MEMORY = 2,
  SPECINFER_ERR_NOT_FOUND = 3,     /* unknown plugin, missing file */
  SPECINFER_ERR_IO = 4,            /* a file could not be read or mapped */
  SPECINFER_ERR_FORMAT = 5,        /* a file or byte string is corrupt or truncated */
  SPECINFER_ERR_ABI_MISMATCH = 6,  /* a plugin built for another plugin ABI */
  SPECINFER_ERR_UNSUPPORTED = 7,   /* valid but not supported (model architecture, type, ...) */
  SPECINFER_ERR_CONFIG = 8,        /* unknown key or bad value in a key=value config */
  SPECINFER_ERR_STATE = 9,         /* call not valid in the object's current state */
  SPECINFER_ERR_CANCELLED = 10,    /* a callback asked to stop */
  SPECINFER_ERR_PLUGIN = 11,       /* a plugin reported a failure */
  SPECINFER_ERR_CONTEXT_FULL = 12, /* the target's context window is full */
  SPECINFER_ERR_BUFFER_TOO_SMALL =
      13,                     /* the caller's buffer is too small; the size needed is returned */
  SPECINFER_ERR_INTERNAL = 14 /* a bug in specinfer; please report it */
} specinfer_status;

/* The static name of a status code ("SPECINFER_ERR_CONFIG"); "SPECINFER_UNKNOWN_STATUS" for a
 * value outside the enum. Never NULL, never freed. */
SPECINFER_API const char *specinfer_status_str(int status);

/* Frees memory the library handed to the caller (error messages). NULL is a no-op. */
SPECINFER_API void specinfer_free(void *ptr);

/* ---------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------- */

typedef enum specinfer_log_level {
  SPECINFER_LOG_DEBUG = 0,
  SPECINFER_LOG_INFO = 1,
  SPECINFER_LOG_WARN = 2,
  SPECINFER_LOG_ERROR = 3,
  SPECINFER_LOG_NONE = 4
} specinfer_log_level;

/* A log sink. Called from whatever thread logs, possibly concurrently; `message` is valid only
 * during the call and has no trailing newline. */
typedef void (*specinfer_log_fn)(void *user, specinfer_log_level level, const char *message);

/* ---------------------------------------------------------------------------------------------
 * The registry: plugins, and the backend's threads
 * ------------------------------------------------------------------------------------------- */

typedef struct specinfer_registry specinfer_registry;
typedef struct specinfer_target specinfer_target;
typedef struct specinfer_drafter specinfer_drafter;
typedef struct specinfer_coupler specinfer_coupler;
typedef struct specinfer_session specinfer_session;
typedef struct specinfer_sketcher specinfer_sketcher;
typedef struct specinfer_constraint specinfer_constraint;

/* Declared in specinfer_plugin.h: what a plugin exports (or an application registers). */
struct specinfer_plugin_descriptor;

typedef struct specinfer_registry_params {
  uint32_t struct_size; /* sizeof(specinfer_registry_params) */
  int32_t
      n_threads; /* backend threads; 0 = SPECINFER_THREADS from the environment, else all cores */
  int32_t
      load_builtin; /* 1 (default): plugins named in open calls are looked up on the plugin path */
  specinfer_log_fn log; /* NULL (default): messages at WARN and above go to stderr */
  void *log_user;
  specinfer_log_level log_level; /* the least severe level passed to `log`; default INFO */
} specinfer_registry_params;

/* Fills `params` with the defaults. */
SPECINFER_API void specinfer_registry_params_init(specinfer_registry_params *params);

/* Creates a registry: the set of loaded plugins and the backend thread pool that targets and
 * drafters opened through it run on. `params` may be NULL for the defaults.
 * Errors: INVALID_ARGUMENT (out NULL, params with a bad struct_size), OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_registry_create(const specinfer_registry_params *params,
                                                         specinfer_registry **out, char **errmsg);

/* Destroys the registry and unloads its plugins. Every target and drafter opened through it must
 * have been destroyed first (they are refused otherwise: STATE, and nothing is freed). */
SPECINFER_API specinfer_status specinfer_registry_destroy(specinfer_registry *registry);

/* The plugin search path: SPECINFER_PLUGIN_PATH (colon-separated) if set, then the directory
 * `specinfer/plugins` beside the loaded library, then `plugins` beside it (build tree), then the
 * install directory compiled in. Returned as one colon-separated string, valid until the registry
 * is destroyed. */
SPECINFER_API const char *specinfer_registry_plugin_path(const specinfer_registry *registry);

/* Loads one plugin file (a shared object exporting `specinfer_plugin_entry`). Loading a plugin
 * whose name is already registered fails with STATE. A plugin built for another plugin ABI is
 * refused with ABI_MISMATCH and a message naming both versions.
 * Errors: INVALID_ARGUMENT, NOT_FOUND, IO (dlopen failed), FORMAT (no entry symbol), ABI_MISMATCH,
 * PLUGIN (its init failed), STATE. */
SPECINFER_API specinfer_status specinfer_registry_load_plugin(specinfer_registry *registry,
                                                              const char *path, char **errmsg);

/* Loads every `specinfer-*.so` in `dir`. Files that fail to load are logged at WARN and skipped;
 * `*n_loaded` (may be NULL) receives how many loaded. Errors: INVALID_ARGUMENT, NOT_FOUND (no such
 * directory). */
SPECINFER_API specinfer_status specinfer_registry_load_dir(specinfer_registry *registry,
                                                           const char *dir, int32_t *n_loaded,
                                                           char **errmsg);

/* Registers a plugin that lives in the calling process (a drafter written in Rust, Go, Python ...).
 * The descriptor and everything it points to must stay valid until the plugin is unloaded or the
 * registry destroyed. Same checks as specinfer_registry_load_plugin. */
SPECINFER_API specinfer_status specinfer_registry_register_plugin(
    specinfer_registry *registry, const struct specinfer_plugin_descriptor *descriptor,
    char **errmsg);

/* Unloads a plugin by name. Fails with STATE while targets or drafters made by it are open,
 * NOT_FOUND when no plugin has that name. */
SPECINFER_API specinfer_status specinfer_registry_unload_plugin(specinfer_registry *registry,
                                                                const char *name, char **errmsg);

/* What the registry says of one loaded plugin. Strings stay valid while the plugin is loaded. */
typedef struct specinfer_plugin_info {
  uint32_t struct_size;
  const char *name;    /* "kgram" */
  const char *version; /* the plugin's own version */
  const char *description;
  const char *path;       /* the file it came from; "" for an in-process plugin */
  int32_t has_target;     /* provides "specinfer.target-factory/1" */
  int32_t has_drafter;    /* provides "specinfer.drafter-factory/1" */
  uint32_t abi_version;   /* plugin ABI it was built for */
  int32_t has_constraint; /* provides "specinfer.constraint-factory/1" (added after abi_version) */
} specinfer_plugin_info;

/* Number of loaded plugins. */
SPECINFER_API int32_t specinfer_registry_plugin_count(const specinfer_registry *registry);
/* Fills `info` (its struct_size set by the caller) for plugin `index` in [0, count).
 * Errors: INVALID_ARGUMENT (NULL, index out of range). */
SPECINFER_API specinfer_status specinfer_registry_plugin_info(const specinfer_registry *registry,
                                                              int32_t index,
                                                              specinfer_plugin_info *info);

/* Backend threads actually in use. */
SPECINFER_API int32_t specinfer_registry_threads(const specinfer_registry *registry);

/* ---------------------------------------------------------------------------------------------
 * Targets: the model whose text we want
 * ------------------------------------------------------------------------------------------- */

/* Opens a target from the plugin `plugin` ("gguf", "kgram", ...) with a `key=value,...` config
 * (may be NULL or ""). If no plugin of that name is loaded, `specinfer-<plugin>.so` is looked for
 * on the plugin path. Unknown config keys are refused (CONFIG). The target holds a model and its
 * own KV cache; it is used by one session at a time and must outlive that session.
 * One model, many targets: while a target opened with the same plugin and config is open (through
 * this registry, by the application or inside a drafter such as draft-model), a plugin that can
 * share (gguf, kgram) opens the new target on that target's loaded model, as specinfer_target_share
 * does, instead of loading the weights again.
 * Errors: INVALID_ARGUMENT, NOT_FOUND, CONFIG, IO, FORMAT, UNSUPPORTED, PLUGIN, OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_target_open(specinfer_registry *registry,
                                                     const char *plugin, const char *config,
                                                     specinfer_target **out, char **errmsg);
/* Opens another target on the model `target` has loaded: weights and tokenizer are shared, not
 * loaded again; the new target has the same info and an empty KV cache of its own. Targets that
 * share a model are used from different threads at once (each by one thread at a time, as any
 * target) and are destroyed in any order: the model stays loaded until the last one is. This call
 * may run while another thread uses `target`. The way to serve many users from one copy of the
 * weights: one target per user (session), all shared from the first.
 * Errors: INVALID_ARGUMENT, UNSUPPORTED (the plugin cannot share: open the target again),
 * PLUGIN, OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_target_share(specinfer_target *target,
                                                      specinfer_target **out, char **errmsg);
/* Closes the target. Fails with STATE (and frees nothing) while a session or drafter uses it. */
SPECINFER_API specinfer_status specinfer_target_destroy(specinfer_target *target);
/* The target's last error message; "" when none. Valid until the next call on the target. */
SPECINFER_API const char *specinfer_target_errmsg(const specinfer_target *target);

typedef struct specinfer_model_info {
  uint32_t struct_size;
  int32_t vocab_size;
  int32_t n_ctx;       /* context window in tokens */
  int32_t hidden_size; /* width of the last hidden state */
  int32_t bos_token;   /* -1 when none */
  int32_t eos_token;   /* -1 when none; generation stops here */
  int32_t eot_token;   /* end of turn, -1 when none; generation stops here too */
  int32_t add_bos;     /* 1 if text prompts start with bos */
  const char *name;    /* model name, valid while the target is open */
  const char *arch;    /* "qwen2", "llama", "kgram", ... */
  /* Added after arch (check struct_size): every token that ends generation, in increasing order:
   * eos, eot, eom and the end tokens the vocabulary spells out (for example <|endoftext|>,
   * <|im_end|>, <end_of_turn>, <|eot_id|>; llama.cpp's end-of-generation rules). A session stops
   * at any of them. eos_token and eot_token are among them when not -1. Valid while the target is
   * open; NULL with n_eog_tokens 0 when the model has none. A target plugin that leaves them
   * unset gets {eos_token, eot_token}. */
  const int32_t *eog_tokens;
  int32_t n_eog_tokens;
  /* Added after n_eog_tokens (check struct_size): the model's chat template (Jinja source, as
   * Hugging Face transformers renders it; a GGUF's tokenizer.chat_template), NULL when it has
   * none. Valid while the target is open. */
  const char *chat_template;
} specinfer_model_info;

/* Fills `info` (its struct_size set by the caller, or by specinfer_model_info_init). */
SPECINFER_API void specinfer_model_info_init(specinfer_model_info *info);
SPECINFER_API specinfer_status specinfer_target_info(specinfer_target *target,
                                                     specinfer_model_info *info);

/* Text -> token ids. `add_special` adds bos (and eos) as the model asks; `parse_special` turns
 * special-token text such as "<|im_start|>" into its id. If `cap` is too small, fails with
 * BUFFER_TOO_SMALL and *n_tokens holds the count needed. */
SPECINFER_API specinfer_status specinfer_target_tokenize(specinfer_target *target, const char *text,
                                                         size_t len, int32_t add_special,
                                                         int32_t parse_special, int32_t *tokens,
                                                         size_t cap, size_t *n_tokens);
/* Token ids -> text bytes. Writes up to `cap` bytes (no terminating NUL); BUFFER_TOO_SMALL with
 * *n_bytes = size needed. A single token may hold part of a UTF-8 character; whole sequences always
 * decode to whole text. */
SPECINFER_API specinfer_status specinfer_target_detokenize(specinfer_target *target,
                                                           const int32_t *tokens, size_t n,
                                                           char *text, size_t cap, size_t *n_bytes);

/* One layer's queries and keys during a pass, as attention reads them (after bias, norm and RoPE):
 * what an attention observer receives (specinfer_eval_params.qk_observer), valid during the call
 * only. */
typedef struct specinfer_qk_view {
  uint32_t struct_size;
  int32_t layer; /* 0 .. n_layer - 1 */
  int32_t n_layer;
  int32_t n_tokens; /* the pass's tokens, at positions first_pos, first_pos + 1, ... */
  int32_t first_pos;
  int32_t n_head;
  int32_t n_head_kv; /* query head h reads kv head h / (n_head / n_head_kv) */
  int32_t head_dim;
  int32_t
      window; /* the layer's sliding window (a query sees the last `window` positions), 0 = all */
  const float *q; /* [n_tokens][n_head][head_dim] */
  const float *k; /* [n_tokens][n_head_kv][head_dim] */
} specinfer_qk_view;
typedef void (*specinfer_qk_observer)(void *ctx, const specinfer_qk_view *view);

/* Scoring a token sequence directly, without a session: the target's raw logits, for measuring a
 * model (perplexity, comparisons with another implementation) rather than generating with it. */
typedef struct specinfer_eval_params {
  uint32_t struct_size;  /* sizeof(specinfer_eval_params) */
  const int32_t *tokens; /* [n_tokens] ids, appended to the sequence in the target's cache */
  size_t n_tokens;
  /* Where the tokens go: the target's cache keeps its first n_past positions (at most the
   * positions it holds, specinfer_target_eval's *n_cached) and drops the rest, and the tokens
   * take positions n_past, n_past + 1 and so on. 0 (default) starts a new sequence. */
  int32_t n_past;
  int32_t n_logits; /* logits for the last n_logits of the tokens, 0 .. n_tokens; default 0 */
  float *logits;    /* out: [n_logits][vocab_size], row i for token n_tokens - n_logits + i */
  /* Added after logits (read only if struct_size covers them). Optional (NULL: none): called with
   * qk_ctx once per layer of the pass, in layer order, during the call (one call at a time, on
   * a thread of the registry's pool), with that layer's
   * queries and keys (measuring attention: `specinfer sketch-eval --model`). A target plugin that
   * does not expose them never calls it (the gguf plugin does). */
  specinfer_qk_observer qk_observer;
  void *qk_ctx;
} specinfer_eval_params;

/* Fills `params` with the defaults (no tokens, n_past 0, no logits). */
SPECINFER_API void specinfer_eval_params_init(specinfer_eval_params *params);
/* Runs the target over params->tokens after its first params->n_past cached positions, as one
 * causal pass, and writes the logits asked for: row i is the model's score of every id as the
 * token after tokens[n_tokens - n_logits + i]. The cache then holds n_past + n_tokens positions,
 * so a long sequence can be scored in passes of any size, each with n_past = the positions scored
 * so far; the logits do not depend on how it is split, up to float summation order.
 * `*n_cached` (may be NULL) receives the positions the cache holds afterwards (before the pass
 * when params is NULL: a query). The target must not be in use by a session; a session made
 * after a pass or truncation starts from an empty cache. n_tokens = 0 only truncates the cache to
 * n_past. Errors: INVALID_ARGUMENT (NULL target, struct_size, NULL tokens or logits, an id outside
 * the vocabulary, n_past beyond the cache, n_logits outside 0 .. n_tokens), STATE (a session uses
 * the target, or the cache could not keep n_past positions: a model with sliding-window layers
 * keeps only the keys those layers still need, and a cut further back than 256 positions before the
 * latest pass keeps nothing; *n_cached then tells what it kept, and gguf's swa_full=1 keeps
 * them all), CONTEXT_FULL (n_past + n_tokens beyond the context window), PLUGIN, OUT_OF_MEMORY;
 * message: specinfer_target_errmsg. */
SPECINFER_API specinfer_status specinfer_target_eval(specinfer_target *target,
                                                     const specinfer_eval_params *params,
                                                     int32_t *n_cached);

/* ---------------------------------------------------------------------------------------------
 * Drafters: cheap proposers
 * ------------------------------------------------------------------------------------------- */

/* Opens a drafter from plugin `plugin` ("ngram", "kgram", "draft-model", ...) for `target` (the
 * drafter must speak the target's vocabulary; it reads the target's info). `config` is
 * `key=value,...`. The target must outlive the drafter.
 * Errors: as specinfer_target_open. */
SPECINFER_API specinfer_status specinfer_drafter_open(specinfer_registry *registry,
                                                      const char *plugin, const char *config,
                                                      specinfer_target *target,
                                                      specinfer_drafter **out, char **errmsg);
/* Closes the drafter. Fails with STATE while a session uses it. */
SPECINFER_API specinfer_status specinfer_drafter_destroy(specinfer_drafter *drafter);
SPECINFER_API const char *specinfer_drafter_errmsg(const specinfer_drafter *drafter);

/* Training a drafter that learns from its target (Medusa heads: `medusa`). */
typedef struct specinfer_train_progress {
  uint32_t struct_size;
  /* "collect" (running the target over the corpus), "train", "evaluate" */
  const char *stage;
  /* units of the stage done and in all (tokens, steps) */
  int64_t done, total;
  /* mean training loss over recent steps; NaN before the first */
  double loss;
  /* per head (n_heads entries), top-1 agreement with the target on held-out text; NULL before
   * the first evaluation */
  int32_t n_heads;
  const float *accuracy;
} specinfer_train_progress;

/* Called now and then during training; return nonzero to stop it (the call fails CANCELLED). */
typedef int (*specinfer_train_progress_fn)(void *user, const specinfer_train_progress *progress);

typedef struct specinfer_train_params {
  uint32_t struct_size;
  const char *config;        /* the drafter's own key=value,... training options; may be NULL */
  const char *const *corpus; /* text files to learn from (never the evaluation prompts) */
  int32_t n_corpus;
  const char *out_path;                 /* the file to write; checkpoints are kept beside it */
  specinfer_train_progress_fn progress; /* may be NULL; called with `user` */
  void *user;
} specinfer_train_params;

SPECINFER_API void specinfer_train_params_init(specinfer_train_params *params);
/* Trains the drafter plugin `plugin`'s weights for `target` and writes them to params->out_path.
 * The target must not be in use by a session for the duration. Errors: INVALID_ARGUMENT,
 * NOT_FOUND, UNSUPPORTED (the plugin has nothing to train), CONFIG, IO, STATE, CANCELLED, PLUGIN,
 * OUT_OF_MEMORY; a message in *errmsg (free with specinfer_free) when errmsg is not NULL. */
SPECINFER_API specinfer_status specinfer_drafter_train(specinfer_registry *registry,
                                                       const char *plugin, specinfer_target *target,
                                                       const specinfer_train_params *params,
                                                       char **errmsg);

/* ---------------------------------------------------------------------------------------------
 * Couplers: which drafted tokens the target keeps
 * ------------------------------------------------------------------------------------------- */

/* Creates a coupler from a spec string:
 *   "greedy"        argmax match (exact for greedy decoding)
 *   "rejection"     modified rejection sampling (exact)
 *   "lenient:L"     Leviathan's lenience L in (0, 1] (lossy; "lenient" alone means L = 0.5; L = 1
 * is "rejection") "gumbel"        Gumbel-max coupling with shared randomness (exact,
 * drafter-invariant) "minhash"       weighted-MinHash coupling (exact, drafter-invariant)
 *   "typical[:EPS[:DELTA]]" Medusa's typical acceptance (lossy)
 * Errors: INVALID_ARGUMENT (NULL), CONFIG (unknown kind or bad parameter). */
SPECINFER_API specinfer_status specinfer_coupler_create(const char *spec, specinfer_coupler **out,
                                                        char **errmsg);
SPECINFER_API void specinfer_coupler_destroy(specinfer_coupler *coupler);
/* The canonical spec string ("lenient:0.5"). Valid while the coupler lives. */
SPECINFER_API const char *specinfer_coupler_name(const specinfer_coupler *coupler);
/* 1 if the emitted text is distributed exactly as the target's, 0 for lossy couplers. */
SPECINFER_API int32_t specinfer_coupler_is_exact(const specinfer_coupler *coupler);

/* The couplers on their own, on distributions the caller supplies. All of them are pure functions
 * of their arguments: the randomness is derived from (seed, position) with a counter-based
 * generator (Philox4x32-10), so the same call gives the same answer on any thread, in any order.
 *
 * Layouts: a row is `vocab` floats. p and q rows are probability distributions: finite,
 * non-negative, summing to 1 within 1e-3 (the greedy coupler reads only the argmax of each row,
 * so for it rows may be any scores without NaN, logits included). `p_len` / `q_len` are the
 * number of floats the caller passes, checked against what the call needs.
 *
 * Bad input - NULL where an array is needed, a size mismatch, NaN/Inf or negative entries, a row
 * not summing to 1, a token outside [0, vocab), a drafted token with q = 0, a tree whose parents
 * do not precede their children - returns SPECINFER_ERR_INVALID_ARGUMENT with a message in
 * *errmsg (when errmsg is not NULL; free it with specinfer_free). Nothing is written to the
 * outputs then. Thread-safe: a coupler may be used from many threads at once. */

/* Verifies a chain of k drafted tokens (k >= 0).
 *   p      (k + 1) rows: the target's distribution at each drafted position and one past the end;
 *          p_len must be (k + 1) * vocab.
 *   q      k rows: the distribution draft[i] was drawn from; NULL (q_len 0) when the drafter is
 *          deterministic (point masses on the drafted tokens; for "rejection" token x is then
 *          kept with probability p(x), which is still exact).
 *   draft  k token ids (may be NULL when k = 0).
 *   seed, position  position is the index in the whole token sequence of draft[0]; together with
 *          seed it fixes all randomness at that position, the same whoever asks.
 * Outputs: *n_accepted in [0, k], the length of the kept prefix of the draft, and *token the next
 * token: the corrected token after a refusal, or the bonus token when the whole draft is kept.
 * With k = 0 this is plain decoding of one token: "rejection" draws it from p, "gumbel" and
 * "minhash" make the target's coupled choice, which is why their text does not depend on the
 * drafter. */
SPECINFER_API specinfer_status specinfer_coupler_verify(const specinfer_coupler *coupler,
                                                        int32_t vocab, int32_t k, const float *p,
                                                        size_t p_len, const float *q, size_t q_len,
                                                        const int32_t *draft, uint64_t seed,
                                                        int64_t position, int32_t *n_accepted,
                                                        int32_t *token, char **errmsg);

/* The draft side: draws one token from q (one row, q_len = vocab) the way a drafter must draw at
 * sequence index `position` for this coupler - with the shared randomness of (seed, position) for
 * "gumbel" and "minhash" (so the draft agrees with the target's choice as often as possible), the
 * argmax for "greedy", a plain draw from q otherwise (independent of the verify side's
 * randomness). */
SPECINFER_API specinfer_status specinfer_coupler_draft_sample(const specinfer_coupler *coupler,
                                                              int32_t vocab, const float *q,
                                                              size_t q_len, uint64_t seed,
                                                              int64_t position, int32_t *token,
                                                              char **errmsg);

/* Verifies a token tree of n_nodes nodes (n_nodes >= 0) in topological order.
 *   tokens   [n_nodes] each node's token.
 *   parents  [n_nodes] each node's parent: -1 for a child of the last committed token, else an
 *            index < the node's own (parents precede children; a chain is parents[j] = j - 1).
 *   p        (n_nodes + 1) rows: row 0 the target after the last committed token, row j + 1 the
 *            target after node j; p_len = (n_nodes + 1) * vocab.
 *   q        n_nodes rows: row j the distribution node j's token was drawn from (siblings drawn
 *            independently, for exactness); NULL (q_len 0) for point masses (siblings should then
 *            be distinct tokens).
 *   Node j's token sits at sequence index position + depth(j), depth 0 for children of the root.
 * Outputs: `path` (room for path_cap >= n_nodes entries) receives the accepted nodes from the root
 * down, *n_accepted their number, *token the next token after the last of them.
 * "greedy", "gumbel" and "minhash" follow, at each node, the child holding the target's own choice
 * (argmax, or the coupled choice); "rejection" and "lenient" use SpecInfer's multi-step
 * speculative sampling: children are tested in index order against a residual distribution that
 * loses each refused child's q, which keeps the output exactly distributed as p ("rejection");
 * "typical" follows the first child that passes its test. A chain gives the same answer as
 * specinfer_coupler_verify. */
SPECINFER_API specinfer_status specinfer_coupler_verify_tree(
    const specinfer_coupler *coupler, int32_t vocab, int32_t n_nodes, const int32_t *tokens,
    const int32_t *parents, const float *p, size_t p_len, const float *q, size_t q_len,
    uint64_t seed, int64_t position, int32_t *path, size_t path_cap, int32_t *n_accepted,
    int32_t *token, char **errmsg);

/* Sampling parameters: how the target's (and a sampling drafter's) logits become the
 * distribution couplers see. Applied in this order: temperature, top-k, top-p, min-p, each on the
 * result of the previous step; then renormalized. */
typedef struct specinfer_sampling_params {
  uint32_t struct_size; /* sizeof(specinfer_sampling_params) */
  float temperature;    /* 0 = greedy: all mass on the argmax (default); > 0 divides the logits */
  int32_t top_k;        /* keep the k most probable tokens; 0 = off (default) */
  float top_p;          /* keep the smallest most-probable set holding at least top_p; 1 = off */
  float min_p;          /* drop tokens below min_p * (the largest probability); 0 = off */
} specinfer_sampling_params;

/* Fills `params` with the defaults (greedy, no filters). */
SPECINFER_API void specinfer_sampling_params_init(specinfer_sampling_params *params);

/* Logits -> probabilities: writes `vocab` probabilities summing to 1 into `probs` (which must not
 * overlap `logits`). Ties (argmax, the top-k and top-p cut-offs) go to the lower token id, so the
 * result is a pure function of the input. Logits may be -inf (masked) but not NaN or +inf, and
 * not all -inf. `params` NULL means the defaults.
 * Errors: INVALID_ARGUMENT (NULL arrays, vocab <= 0, bad logits, temperature < 0, top_k < 0,
 * top_p outside (0, 1], min_p outside [0, 1], a bad struct_size). */
SPECINFER_API specinfer_status specinfer_sample_probs(const float *logits, int32_t vocab,
                                                      const specinfer_sampling_params *params,
                                                      float *probs, char **errmsg);

/* ---------------------------------------------------------------------------------------------
 * Sessions: generate text
 * ------------------------------------------------------------------------------------------- */

typedef struct specinfer_session_params {
  uint32_t struct_size;   /* sizeof(specinfer_session_params) */
  int32_t max_draft;      /* most tokens drafted per round (k), 0..16; default 8 */
  int32_t adaptive_draft; /* 1 (default): choose k each round from recent acceptance */
  float temperature;      /* 0 = greedy (default); > 0 samples */
  int32_t top_k;          /* 0 = off */
  float top_p;            /* 1 = off */
  float min_p;            /* 0 = off */
  uint64_t seed;          /* randomness for sampling and coupling; default 0 */
  /* When a round finds the context window full: 0 (default) fails with CONTEXT_FULL; 1 shifts
   * the context and goes on. A shift keeps the first n_keep tokens (and the first token when it
   * is the model's bos), drops the older half of the rest and scores the kept tokens again, so
   * that what follows is what a fresh session fed the kept tokens would generate (the same text
   * with and without a drafter). The re-scoring costs a prefill of about half the window. Text
   * fed past the window is accepted too, and the next round shifts as often as it takes. */
  int32_t context_shift;
  int32_t n_keep; /* >= 0; default 0. A shift that would drop nothing fails with CONTEXT_FULL */
} specinfer_session_params;

SPECINFER_API void specinfer_session_params_init(specinfer_session_params *params);

/* Creates a session that generates with `target`, drafting with `drafter` (NULL: plain decoding)
 * and verifying with `coupler` (NULL: "greedy" when temperature is 0, else "rejection"). The
 * session borrows all three; they must outlive it, and target and drafter may be used by one
 * session at a time (STATE otherwise). `params` may be NULL for the defaults. The session starts
 * from what the last session on the target left in its cache: its first round keeps the prefix
 * its text shares with that session's text and scores only the rest (as after
 * specinfer_session_reset), unless the cache was changed since (specinfer_target_eval), when it
 * starts from an empty cache.
 * Errors: INVALID_ARGUMENT, STATE, OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_session_create(specinfer_target *target,
                                                        specinfer_drafter *drafter,
                                                        const specinfer_coupler *coupler,
                                                        const specinfer_session_params *params,
                                                        specinfer_session **out, char **errmsg);
SPECINFER_API void specinfer_session_destroy(specinfer_session *session);
/* The session's last error message; "" when none. Valid until the next call on the session. */
SPECINFER_API const char *specinfer_session_errmsg(const specinfer_session *session);

/* Appends prompt text (tokenized with the target's tokenizer; bos is added when the session is
 * empty and the model asks for it; special-token text is parsed). The target scores it at the next
 * generate/step call. Errors: INVALID_ARGUMENT, CONTEXT_FULL (the text would not fit the window,
 * and the session does not shift its context), PLUGIN. */
SPECINFER_API specinfer_status specinfer_session_feed_text(specinfer_session *session,
                                                           const char *text, size_t len);
/* Appends prompt tokens (ids checked against the vocabulary). */
SPECINFER_API specinfer_status specinfer_session_feed_tokens(specinfer_session *session,
                                                             const int32_t *tokens, size_t n);

/* Feeds an empty session the first n_tokens tokens of src's text (prompt and generated), src
 * being a session on a target that shares this session's loaded model (specinfer_target_share,
 * or opened with the same plugin and config): the positions src has scored among them are copied
 * into this session's cache instead of being scored again, so that one prompt scored once serves
 * several continuations (n choices of one request: each session with its own seed, drafter and
 * settings). A target plugin that cannot copy its cache (no kv_copy, or not this cache) leaves
 * the tokens to be scored at the next round, as feed_tokens would. src does not change; the
 * caller holds both sessions for the call. Stop strings, constraint and log-probability settings
 * are the session's own, not src's. Errors: INVALID_ARGUMENT (NULL, n_tokens outside 1 .. src's
 * tokens, a target on another model), STATE (the session has text already), CONTEXT_FULL,
 * PLUGIN. */
SPECINFER_API specinfer_status specinfer_session_feed_from(specinfer_session *session,
                                                           specinfer_session *src, size_t n_tokens);

/* Called with each batch of newly generated tokens and the text they complete. `text` holds only
 * whole UTF-8 characters (a character split across tokens is delivered with its last token) and is
 * not NUL-terminated. Return 0 to go on, nonzero to stop (generate then returns CANCELLED). */
typedef int (*specinfer_token_fn)(void *user, const int32_t *tokens, size_t n_tokens,
                                  const char *text, size_t text_len);

/* Generates up to `max_tokens` tokens, or until the text ends (an end-of-generation token,
 * specinfer_model_info.eog_tokens, or a stop string), calling `on_tokens` (may be NULL) after each
 * round. The last call's text includes what was held back for the stop strings. Errors:
 * INVALID_ARGUMENT, STATE (nothing fed yet), CONTEXT_FULL, CANCELLED, PLUGIN. */
SPECINFER_API specinfer_status specinfer_session_generate(specinfer_session *session,
                                                          int32_t max_tokens,
                                                          specinfer_token_fn on_tokens, void *user);

/* Runs one speculate -> verify -> commit round and writes the tokens it emitted (between 1 and
 * k+1) to `tokens`. The round emits at most `cap` tokens (it drafts fewer when cap is below
 * max_draft + 1: a caller with a token budget passes what is left of it); cap 0 is
 * BUFFER_TOO_SMALL. *done is set to 1 when the round ended the text: an end-of-generation token,
 * or the token that completes a stop string (the last token written; nothing after it is kept). */
SPECINFER_API specinfer_status specinfer_session_step(specinfer_session *session, int32_t *tokens,
                                                      size_t cap, size_t *n_tokens, int32_t *done);

/* One session's part of specinfer_session_step_many. */
typedef struct specinfer_step_result {
  uint32_t struct_size; /* sizeof(specinfer_step_result) */
  int32_t *tokens;      /* in: room for `cap` tokens; the round emits at most cap (>= 1) */
  size_t cap;
  size_t n_tokens;         /* out: tokens the round emitted */
  int32_t done;            /* out: 1 when the round ended the text (as specinfer_session_step) */
  specinfer_status status; /* out: this session's status (message: specinfer_session_errmsg) */
} specinfer_step_result;

/* How specinfer_session_step_many runs. */
typedef struct specinfer_step_params {
  uint32_t struct_size; /* sizeof(specinfer_step_params) */
  /* Chunked prefill: a session whose prompt is not scored yet scores at most this many of its
   * tokens in the call's pass (its result then has no tokens) instead of the whole prompt in a
   * pass of its own, so that a long prompt arriving delays the other sessions' tokens by a little
   * per call rather than by a whole prefill. Smaller chunks keep the others' latency lower and
   * take more calls to finish the prompt. 0: the whole prompt at once. Default 64. */
  int32_t prefill_chunk;
} specinfer_step_params;

SPECINFER_API void specinfer_step_params_init(specinfer_step_params *params);

/* Runs one round of each of n distinct sessions, as specinfer_session_step would, with a single
 * target pass for all sessions whose targets share one loaded model (specinfer_target_share, or
 * targets opened with the same plugin and config): the weights are read once for all of them, so
 * on a memory-bound CPU n sessions advance for little more than the cost of one. Each session's
 * tokens are those its own specinfer_session_step would emit, bit for bit; a session still
 * scoring its prompt in chunks (params->prefill_chunk) emits none in that call. Continuous
 * batching is a loop over this call with the sessions that are still generating; sessions may
 * join and leave between calls. `params` may be NULL for the defaults. The caller holds all n
 * sessions for the call. Returns OK when every session's call succeeded, else the first failing
 * session's status; each result has its own status, and a failing session does not stop the
 * others. A malformed call (NULL arrays, a struct_size too small, a session twice) runs nothing
 * and returns INVALID_ARGUMENT. Per session: INVALID_ARGUMENT (NULL session or tokens),
 * BUFFER_TOO_SMALL, and the errors of specinfer_session_step. */
SPECINFER_API specinfer_status specinfer_session_step_many(specinfer_session *const *sessions,
                                                           specinfer_step_result *results, size_t n,
                                                           const specinfer_step_params *params);

/* The text of the tokens the session's last specinfer_session_step or step_many call emitted, as
 * specinfer_session_generate's callback gets it: whole UTF-8 characters (a character split
 * between calls comes whole with the later one), no text for end-of-generation tokens, and with
 * stop strings set, no text that may begin one until it is known not to (see
 * specinfer_session_set_stop_strings). Owned by the session, valid until its next call. Errors:
 * INVALID_ARGUMENT (NULL). */
SPECINFER_API specinfer_status specinfer_session_step_text(const specinfer_session *session,
                                                           const char **text, size_t *len);

/* Stop strings: the generated text ends right before the first occurrence of any of them (in the
 * text generated since the last feed, across token boundaries). The round whose token completes
 * one sets done, keeps that token as the session's last and emits no text from the stop string on;
 * the stop string itself is never part of the text. Until the text shows that a tail of it cannot
 * begin a stop string, that tail is held back (step_text and the generate callback leave it out).
 * When the text ends otherwise, the held text is released: by generate's last callback, by the
 * round that emits an end-of-generation token, or by specinfer_session_end_text when the caller
 * ends it (for example at its token budget). Feeding or resetting forgets held text. `n` strings
 * (at most 64, each at most 1024 bytes, NUL-terminated; empty ones are ignored) replace the
 * previous set; n = 0 clears it. Errors: INVALID_ARGUMENT (NULL session or string, too many or too
 * long). */
SPECINFER_API specinfer_status specinfer_session_set_stop_strings(specinfer_session *session,
                                                                  const char *const *stops,
                                                                  size_t n);

/* Ends the text where the caller ends it (a token budget reached): returns the text held back for
 * the stop strings (possibly empty) and forgets it. Owned by the session, valid until its next
 * call. Errors: INVALID_ARGUMENT (NULL). */
SPECINFER_API specinfer_status specinfer_session_end_text(specinfer_session *session,
                                                          const char **text, size_t *len);

/* Most alternatives per token specinfer_session_set_logprobs keeps. */
#define SPECINFER_MAX_TOP_LOGPROBS 20

/* Log-probabilities of the emitted tokens, from the next round on: top_n >= 0 turns them on, with
 * the top_n (at most SPECINFER_MAX_TOP_LOGPROBS) most likely tokens at each position beside the
 * emitted one; -1 turns them off (the default). They are the target's own: the log-softmax of its
 * raw scores at that position (no temperature, top-p or constraint applied), as of the logits
 * specinfer_target_eval gives for the same text (up to float summation order), whatever the
 * drafter and coupler chose and whichever batch scored them. Ties among the alternatives go to
 * the lower id. Costs a pass over the vocabulary per scored row while on. Errors:
 * INVALID_ARGUMENT (NULL, top_n outside -1 .. SPECINFER_MAX_TOP_LOGPROBS). */
SPECINFER_API specinfer_status specinfer_session_set_logprobs(specinfer_session *session,
                                                              int32_t top_n);

/* The log-probabilities of the tokens the last round emitted (specinfer_session_step, step_many,
 * or the rounds of specinfer_session_generate, in its callback): *n tokens (0 when the
 * log-probabilities are off or the round scored a prompt chunk), tokens[i] with logprobs[i], and
 * their top_n alternatives each, most likely first: top_tokens[i * top_n + j], top_logprobs[i *
 * top_n + j]. Owned by the session, valid until its next call that changes it. Any output pointer
 * may be NULL. Errors: INVALID_ARGUMENT (NULL session). */
SPECINFER_API specinfer_status specinfer_session_step_logprobs(
    const specinfer_session *session, const int32_t **tokens, const float **logprobs,
    const int32_t **top_tokens, const float **top_logprobs, size_t *n, int32_t *top_n);

/* Log-probabilities of the text's own tokens (a prompt's, as OpenAI's echo with logprobs gives
 * them, or an evaluation's log-likelihood of a continuation): top_n >= 0 turns them on, with the
 * top_n (at most SPECINFER_MAX_TOP_LOGPROBS) most likely tokens at each position; -1 turns them off
 * (the default). While on, every token of the session's text from the second up to the last one
 * fed (specinfer_session_feed_text or feed_tokens, before or after this call) gets the
 * log-probability the target gives it after the tokens before it, as the next steps score the
 * text: in full (a prefix cached from an earlier text is scored again), in passes of at most 64
 * tokens. The numbers are those of specinfer_session_set_logprobs (raw scores, any batch). A reset
 * or a context shift starts the entries over. Errors: INVALID_ARGUMENT (NULL, top_n out of range).
 */
SPECINFER_API specinfer_status specinfer_session_set_prompt_logprobs(specinfer_session *session,
                                                                     int32_t top_n);

/* The text's log-probabilities scored so far (specinfer_session_set_prompt_logprobs): *n entries,
 * entry i for the text's token i + 1 (the first token has none): tokens[i], logprobs[i], and
 * top_n alternatives, most likely first: top_tokens[i * top_n + j], top_logprobs[i * top_n + j].
 * All are there once the first round after the feed has run (or *n is the fed text's length less
 * one). Owned by the session, valid until its next call that changes it. Any output pointer may be
 * NULL. Errors: INVALID_ARGUMENT (NULL session). */
SPECINFER_API specinfer_status specinfer_session_prompt_logprobs(
    const specinfer_session *session, const int32_t **tokens, const float **logprobs,
    const int32_t **top_tokens, const float **top_logprobs, size_t *n, int32_t *top_n);

typedef struct specinfer_session_stats {
  uint32_t struct_size;
  int64_t n_prompt_tokens;  /* tokens fed */
  int64_t n_generated;      /* tokens emitted */
  int64_t n_rounds;         /* speculate/verify rounds */
  int64_t n_target_passes;  /* target forward calls (prefill included) */
  int64_t n_drafted;        /* tokens proposed by the drafter */
  int64_t n_accepted;       /* drafted tokens the coupler kept */
  double acceptance_rate;   /* n_accepted / n_drafted (0 when nothing drafted) */
  double mean_accepted;     /* tokens emitted per round: accepted + 1 */
  double t_prefill_ms;      /* time scoring the prompt */
  double t_draft_ms;        /* time in the drafter */
  double t_verify_ms;       /* time in target forward passes after the prompt */
  double t_sample_ms;       /* time turning logits into distributions and coupling */
  double t_total_ms;        /* wall time of generate/step calls, prefill included */
  double tokens_per_second; /* n_generated / (t_total_ms - t_prefill_ms) */
  int64_t n_context_shifts; /* context shifts (specinfer_session_params.context_shift); the
                               kept text's scoring counts in t_prefill_ms */
  /* Added after n_context_shifts. With a constraint (specinfer_session_set_constraint): tokens
   * the constraint forced and the session drafted itself, and of them, kept; the time spent on
   * the constraint: its masks and forced tokens, masking the scores and advancing it. The
   * drafter's tokens the constraint ruled out before the pass are not in n_drafted. */
  int64_t n_forced_drafted;
  int64_t n_forced_accepted;
  double t_constraint_ms;
  /* Added after t_constraint_ms. Positions of the text that the first round after a feed found
   * in the target's cache (kept from this session's earlier text, the text of the target's last
   * session, or copied by specinfer_session_feed_from) and did not score again. */
  int64_t n_cached_tokens;
  /* Added after n_cached_tokens. Rounds in which the drafter drafted and estimated how many of
   * its nodes the target would keep (specinfer_draft.expected_accepted), the sum of those
   * estimates, and the sum of the drafted tokens the target kept in the same rounds: the two
   * means say how well the drafter knows its drafts on this text. */
  int64_t n_estimated_rounds;
  double expected_accepted;
  double estimated_rounds_accepted;
} specinfer_session_stats;

/* Fills `stats` (struct_size set by the caller or by specinfer_session_stats_init). */
SPECINFER_API void specinfer_session_stats_init(specinfer_session_stats *stats);
SPECINFER_API specinfer_status specinfer_session_get_stats(const specinfer_session *session,
                                                           specinfer_session_stats *stats);

/* The session's last round (specinfer_session_step, a step_many call, or a round of
 * specinfer_session_generate): how many tokens it could draft, drafted and kept, and the time of
 * its target pass beside the time the model's measured pass costs predicted for that many tokens
 * before it ran, so that a caller can see why a round drafted what it did. For a session stepped
 * with others on one loaded model (specinfer_session_step_many) the pass fields are the shared
 * pass's and the goodput fields are the budget rule's plan for the whole step: the expected
 * tokens per second of the drafts it chose, and of the same step with no session drafting (the
 * rule never picks a plan expected to be slower). A call that only scored a chunk of the prompt
 * leaves it unchanged; before any round every field is 0. */
typedef struct specinfer_round_info {
  uint32_t struct_size;     /* sizeof(specinfer_round_info) (specinfer_round_info_init) */
  int32_t n_sessions;       /* sessions whose rounds shared the pass (1: alone) */
  int32_t n_pass_tokens;    /* tokens the pass scored, prompt chunks of other sessions included */
  int32_t draft_budget;     /* most tokens this session could draft this round (0: plain) */
  int32_t n_drafted;        /* tokens its drafter proposed */
  int32_t n_accepted;       /* of them, kept */
  double draft_ms;          /* its drafting time */
  double pass_ms;           /* the pass's measured time */
  double predicted_pass_ms; /* the pass time predicted for n_pass_tokens (0: nothing measured) */
  double goodput;           /* the step's plan: expected tokens per second (0: a session alone) */
  double plain_goodput;     /* the same step with no session drafting */
  /* Added after plain_goodput: the drafter's own estimate of n_accepted (-1: none given). */
  double expected_accepted;
} specinfer_round_info;

SPECINFER_API void specinfer_round_info_init(specinfer_round_info *info);
/* Fills as much of `info` as its struct_size covers. Errors: INVALID_ARGUMENT (NULL, or
 * struct_size below 4). */
SPECINFER_API specinfer_status specinfer_session_round_info(const specinfer_session *session,
                                                            specinfer_round_info *info);

/* Forgets the text and the statistics; the session can be fed a new prompt. */
SPECINFER_API specinfer_status specinfer_session_reset(specinfer_session *session);

/* The session's whole token sequence (prompt and generated; after a context shift, the tokens it
 * kept). The pointer is valid until the next call that changes the session. */
SPECINFER_API specinfer_status specinfer_session_tokens(const specinfer_session *session,
                                                        const int32_t **tokens, size_t *n);

/* ---------------------------------------------------------------------------------------------
 * Constraints: structured output
 * ------------------------------------------------------------------------------------------- */

/* Opens a constraint: the text a session generates must match `grammar` (NUL-terminated) of
 * `kind`, compiled by plugin `plugin` (loaded from the plugin path like targets; "llguidance"
 * knows "json_schema" (a JSON Schema), "json_object" (any JSON object; grammar ignored, may be
 * "" or NULL), "regex" (a regular expression the whole text matches) and "lark" (a context-free
 * grammar in Lark syntax)) for the vocabulary of `target`. `config` is `key=value,...`. The
 * target must outlive the constraint.
 * At each position the constraint gives the tokens that may come next; a session masks the
 * target's scores with it (see specinfer_session_set_constraint).
 * Errors: INVALID_ARGUMENT (NULL, or a grammar that does not compile: the message says why),
 * UNSUPPORTED (a kind the plugin does not know), NOT_FOUND (no such plugin, or it provides no
 * constraints), CONFIG, PLUGIN, OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_constraint_open(specinfer_registry *registry,
                                                         const char *plugin, const char *config,
                                                         specinfer_target *target, const char *kind,
                                                         const char *grammar,
                                                         specinfer_constraint **out, char **errmsg);
/* A new constraint in `constraint`'s present state, compiled once for both: for several sessions
 * on one grammar (the state at creation is the start of the text). Not while a session on another
 * thread uses `constraint`. Errors: INVALID_ARGUMENT, PLUGIN, OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_constraint_fork(specinfer_constraint *constraint,
                                                         specinfer_constraint **out, char **errmsg);
/* Closes the constraint. Fails with STATE (and frees nothing) while a session uses it. */
SPECINFER_API specinfer_status specinfer_constraint_destroy(specinfer_constraint *constraint);
/* The constraint's last error message; "" when none. */
SPECINFER_API const char *specinfer_constraint_errmsg(const specinfer_constraint *constraint);

/* Constrains the text the session generates from its next round on (NULL: no constraint). The
 * constraint starts from its state when set; feeding the session (or resetting it) takes it back
 * to that state, so each generation after a prompt matches the grammar from its start. At every
 * position the session scores, the target's logits of the tokens the constraint rules out become
 * -inf before sampling and coupling: greedy output is exactly the constrained plain output, and
 * sampled output is distributed as the masked, renormalized target distribution (with the gumbel
 * coupler, identical to plain decoding at the same seed), whatever the drafter. Drafted tokens
 * the constraint rules out are dropped before the target pass (with their subtree), and where the
 * constraint forces the next tokens the session drafts them itself, with or without a drafter,
 * so that they are verified in the same pass. The text ends at an end-of-generation token (which
 * the constraint allows only where the text may end) or when the constraint has ended; a round
 * after that fails with STATE until the session is fed or reset, or the constraint cleared. A
 * constraint is used by one session at a time and must outlive its use; it must have been opened
 * for the session's target or a target sharing its model (specinfer_target_share).
 * Errors: INVALID_ARGUMENT (NULL session; a constraint for another model's vocabulary), STATE
 * (another session uses the constraint), PLUGIN. */
SPECINFER_API specinfer_status specinfer_session_set_constraint(specinfer_session *session,
                                                                specinfer_constraint *constraint);

/* ---------------------------------------------------------------------------------------------
 * Sketchers: inner-product sketches
 * ------------------------------------------------------------------------------------------- */

/* A sketcher compresses vectors of dimension d into sketches of m << d numbers such that the
 * inner product <a, b> is estimated from the two sketches alone, unbiased, with known variance
 * (attention scores, vector search, join-size estimation). It is immutable after creation and may
 * be shared by any number of threads.
 *
 * Kinds, with the variance of one estimate (||a_I|| is a restricted to the common support I):
 *   "jl"          y = S a / sqrt(m), S dense Gaussian (default) or +-1 ("dist=sign").
 *                 Gaussian: (||a||^2 ||b||^2 + <a,b>^2) / m; +-1: the same minus 2 sum a_i^2 b_i^2
 * / m. "countsketch" sparse JL: each column of S has s nonzeros +-1/sqrt(s) ("s=1" default, one per
 *                 column: the classic CountSketch); O(s * nnz) to apply. At most 2||a||^2||b||^2/m.
 *   "qjl"         1-bit: a key sketch keeps sign(S a) (m bits) and ||a||; a query sketch keeps S q
 *                 (m floats, flag SPECINFER_SKETCH_QUERY). Estimate sqrt(pi/2)/m * ||a|| *
 *                 <S q, sign(S a)>, variance ((pi/2)||a||^2||b||^2 - <a,b>^2) / m. "orthogonal=1"
 *                 orthogonalizes the rows of S (needs d*m <= 2^22). Two query sketches give the
 *                 Gaussian JL estimate; two key sketches are refused.
 *   "threshold"   coordinated threshold sampling: index i is kept when h(i) < min(1, m
 * a_i^2/||a||^2) with h a hash shared by all sketches of the same seed; expected size <= m.
 *   "priority"    priority sampling with weights a_i^2: the m indices of smallest h(i)/a_i^2;
 *                 exactly min(m, nnz(a)) samples.
 *                 Both samplers: variance at most (2/m) max(||a_I||^2 ||b||^2, ||a||^2 ||b_I||^2),
 *                 far below the linear sketches when a and b overlap little.
 * Options common to all kinds: "simd=auto|avx2|scalar" picks the kernels (the bytes of a sketch do
 * not depend on it beyond float rounding of the projections); auto follows the library's
 * instruction set, which the environment variable SPECINFER_ISA caps, as for the model kernels.
 *
 * Sketches are self-describing byte strings (magic, kind, format version, d, m, a hash of the seed
 * and options, payload). Every call that reads sketches checks them: bytes that are not a sketch,
 * truncated or padded give FORMAT; a sketch of another kind, dimension, size, seed or options gives
 * INVALID_ARGUMENT. Sketches made by two sketchers created with the same arguments are
 * interchangeable. Layout: little-endian; see lib/sketch/format.h.
 *
 * Randomness is a counter-based hash of (seed, index): the same vector under the same seed gives
 * the same bytes in every run, on any thread, with any thread count.
 *
 * Limits: 1 <= d <= 2^28, 1 <= m <= 2^24. Vectors are `dim` floats, all finite (NaN/Inf:
 * INVALID_ARGUMENT). Every function below with a `char **errmsg` sets it as the create functions
 * do (a message freed with specinfer_free, or NULL on success; errmsg may be NULL). */

/* Creates a sketcher. `kind` is "jl", "countsketch", "qjl", "threshold" or "priority"; `dim` the
 * dimension of the vectors, `size` the sketch size m, `seed` fixes the randomness, `options` a
 * `key=value,...` string (may be NULL): "dist=gaussian|sign" (jl), "s=N" (countsketch, 1 <= N <=
 * min(m, 256)), "orthogonal=0|1" (qjl), "simd=auto|avx2|scalar" (all).
 * Errors: INVALID_ARGUMENT (NULL out or kind, dim or size out of range), CONFIG (unknown kind,
 * unknown option or bad value), UNSUPPORTED (simd=avx2 on a CPU without it), OUT_OF_MEMORY. */
SPECINFER_API specinfer_status specinfer_sketcher_create(const char *kind, int64_t dim,
                                                         int64_t size, uint64_t seed,
                                                         const char *options,
                                                         specinfer_sketcher **out, char **errmsg);
SPECINFER_API void specinfer_sketcher_destroy(specinfer_sketcher *sketcher);

/* Flags of the sketch calls. */
#define SPECINFER_SKETCH_QUERY 1 /* make a query-side sketch (qjl: S q); ignored by other kinds */

typedef struct specinfer_sketcher_info {
  uint32_t struct_size; /* sizeof(specinfer_sketcher_info), set by the caller */
  const char *kind;     /* "jl", ...; static string */
  int64_t dim;          /* d */
  int64_t size;         /* m */
  uint64_t seed;
  size_t key_bytes;   /* bytes of a (key) sketch: exact, or an upper bound when !fixed_size */
  size_t query_bytes; /* bytes of a query sketch (SPECINFER_SKETCH_QUERY), same rule */
  int32_t fixed_size; /* 1 when every sketch has exactly key_bytes / query_bytes */
  int32_t linear;     /* 1 when specinfer_sketcher_distance2 is supported */
  const char *simd;   /* kernels in use: "avx2" or "scalar"; static string */
} specinfer_sketcher_info;

/* Describes a sketcher. Errors: INVALID_ARGUMENT (NULL, struct_size too small). */
SPECINFER_API specinfer_status specinfer_sketcher_get_info(const specinfer_sketcher *sketcher,
                                                           specinfer_sketcher_info *info);

/* The serialized size in bytes of a sketch with `flags`: *n_bytes is exact when *exact is set to 1
 * (jl, countsketch, qjl), else an upper bound (threshold: 40 + 8 d; priority: 40 + 8 min(m, d)).
 * `exact` may be NULL. Errors: INVALID_ARGUMENT. */
SPECINFER_API specinfer_status specinfer_sketcher_sketch_bytes(const specinfer_sketcher *sketcher,
                                                               int32_t flags, size_t *n_bytes,
                                                               int32_t *exact);

/* Sketches one vector `x` of `n` floats (n must equal dim) into `buf` (`cap` bytes). *n_bytes
 * receives the sketch's length. When cap is too small (buf may then be NULL), nothing is written
 * and BUFFER_TOO_SMALL is returned with *n_bytes = the length needed: call with cap 0 to ask.
 * Errors: INVALID_ARGUMENT (NULL, n != dim, NaN/Inf, overflow of float), BUFFER_TOO_SMALL. */
SPECINFER_API specinfer_status specinfer_sketcher_sketch(const specinfer_sketcher *sketcher,
                                                         const float *x, size_t n, int32_t flags,
                                                         void *buf, size_t cap, size_t *n_bytes,
                                                         char **errmsg);

/* Sketches the `n_rows` rows of a row-major matrix (row i starts at rows + i * row_stride floats;
 * each row has dim floats; row_stride >= dim) in parallel on the oneTBB pool. The sketches are
 * written back to back into `buf`; `offsets` (n_rows + 1 entries, may be NULL) receives where each
 * starts, offsets[n_rows] being the total. The bytes are those of n_rows calls of
 * specinfer_sketcher_sketch, whatever the number of threads. Size query as above: with a too small
 * cap, BUFFER_TOO_SMALL and *n_bytes = the total needed (offsets untouched).
 * Errors: INVALID_ARGUMENT (NULL, stride < dim, a bad row: the message names the first one),
 * BUFFER_TOO_SMALL. */
SPECINFER_API specinfer_status specinfer_sketcher_sketch_rows(
    const specinfer_sketcher *sketcher, const float *rows, size_t n_rows, size_t row_stride,
    int32_t flags, void *buf, size_t cap, size_t *offsets, size_t *n_bytes, char **errmsg);

/* Estimates <a, b> from two sketches made by this sketcher (or one with the same arguments).
 * For qjl, one sketch is a key and the other a query (either order), or both are queries.
 * Errors: INVALID_ARGUMENT (NULL, foreign sketch, two qjl keys), FORMAT (not a sketch,
 * truncated, corrupt). */
SPECINFER_API specinfer_status specinfer_sketcher_estimate(const specinfer_sketcher *sketcher,
                                                           const void *a, size_t a_len,
                                                           const void *b, size_t b_len,
                                                           double *estimate, char **errmsg);

/* Estimates <q, k_i> for many stored sketches at once (the attention use: one score per key).
 * Key i is keys[offsets[i], offsets[i + 1]) - exactly the layout specinfer_sketcher_sketch_rows
 * writes; `offsets` has n_keys + 1 entries. `scores` receives n_keys estimates. For qjl the query
 * is a query sketch and the keys are key sketches. Every key is checked before any score is
 * computed. Errors: as specinfer_sketcher_estimate; messages name the offending key. */
SPECINFER_API specinfer_status specinfer_sketcher_estimate_many(
    const specinfer_sketcher *sketcher, const void *query, size_t query_len, const void *keys,
    const size_t *offsets, size_t n_keys, double *scores, char **errmsg);

/* Estimates ||a - b||^2 for the linear kinds (jl, countsketch; qjl from two query sketches), with
 * the same guarantees as the inner product. Errors: as specinfer_sketcher_estimate, plus
 * UNSUPPORTED for the sampling kinds and qjl key sketches. */
SPECINFER_API specinfer_status specinfer_sketcher_distance2(const specinfer_sketcher *sketcher,
                                                            const void *a, size_t a_len,
                                                            const void *b, size_t b_len,
                                                            double *distance2, char **errmsg);

/* What a sketch's header says, without a sketcher. */
typedef struct specinfer_sketch_header {
  uint32_t struct_size; /* sizeof(specinfer_sketch_header), set by the caller */
  const char *kind;     /* "jl", ...; static string */
  int32_t is_query;     /* 1 for a qjl query sketch */
  int64_t dim;
  int64_t size;   /* m */
  int64_t count;  /* entries stored: m for projections, the number of samples for samplers */
  size_t n_bytes; /* total length (header included) */
} specinfer_sketch_header;

/* Reads and checks the header of the sketch in bytes[0, len). Errors: INVALID_ARGUMENT (NULL,
 * struct_size too small), FORMAT (not a sketch, unknown version, truncated or padded). */
SPECINFER_API specinfer_status specinfer_sketch_read_header(const void *bytes, size_t len,
                                                            specinfer_sketch_header *header,
                                                            char **errmsg);

#ifdef __cplusplus
}
#endif

#endif /* SPECINFER_H */
