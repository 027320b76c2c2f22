// Constraints (specinfer_constraint_open, the llguidance plugin) on the real Qwen2.5-Coder models:
//  - the plugin loads, and refuses bad input with a status and a message that says why: NULLs, an
//    unknown kind or config key, a schema / regex / grammar that does not compile, a constraint
//    of another model's vocabulary, one constraint in two sessions;
//  - constrained greedy output of the 1.5B (plain decoding) is JSON that satisfies the schema
//    (the 0.5B in the sanitizer builds, SPECINFER_SANITIZED=1);
//  - speculative constrained output (draft-model, ngram) equals plain constrained output token for
//    token: greedy, and the gumbel coupler at a fixed seed; rejection sampling with the draft
//    model's (masked) q rows gives schema-valid text;
//  - tokens the grammar forces are drafted by the session, with or without a drafter, alone and
//    stepped together with another session (specinfer_session_step_many), and kept;
//  - a regex and a Lark grammar constrain the text too (the whole text matches);
// and prints the time the constraint takes per generated token beside the target's pass time.
// Skips (with a message) without the models or without the plugin (no cargo new enough).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specinfer.h"
#include "support/cmocka_setup.h"
#include "support/models.h"
#include "support/real_sessions.h"
#include "support/same_tokens.h"
#include "support/step_together.h"

namespace {

const char *const kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 18, "maximum": 99},
    "languages": {"type": "array", "items": {"enum": ["python", "rust", "go", "c"]},
                  "minItems": 1, "maxItems": 3},
    "senior": {"type": "boolean"}
  },
  "required": ["name", "age", "languages", "senior"],
  "additionalProperties": false
})";

const char *const kPrompt =
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nDescribe a "
    "fictional programmer as JSON with name, age, languages and whether they are "
    "senior.<|im_end|>\n<|im_start|>assistant\n";

struct Env {
  RealTarget big;       // the 1.5B target (the 0.5B in the sanitizer builds)
  std::string draft;    // the 0.5B's path
  bool plugin = false;  // the llguidance plugin is on the plugin path
};

int setup(void **state) {
  const std::string dir = models_dir();
  const std::string big = dir + "/qwen2.5-coder-1.5b.gguf",
                    small = dir + "/qwen2.5-coder-0.5b.gguf";
  // The sanitizer builds check memory and exactness on the 0.5B as target too: the 1.5B runs
  // several times slower there.
  const char *sanitized = std::getenv("SPECINFER_SANITIZED");
  const bool small_target = sanitized && std::strcmp(sanitized, "1") == 0;
  *state = nullptr;
  if (!is_regular_file(small.c_str()) || (!small_target && !is_regular_file(big.c_str()))) return 0;
  auto *e = new Env;
  if (!e->big.open(small_target ? small : big)) {
    delete e;
    return -1;
  }
  e->draft = small;
  specinfer_constraint *c = nullptr;
  char *err = nullptr;
  const specinfer_status rc = specinfer_constraint_open(e->big.reg, "llguidance", nullptr,
                                                        e->big.target, "json_object", "", &c, &err);
  e->plugin = rc != SPECINFER_ERR_NOT_FOUND;
  if (rc != SPECINFER_OK && e->plugin)
    std::fprintf(stderr, "opening a json_object constraint: %s\n", err ? err : "?");
  specinfer_free(err);
  specinfer_constraint_destroy(c);
  *state = e;
  return rc == SPECINFER_OK || !e->plugin ? 0 : -1;
}

int teardown(void **state) {
  auto *e = static_cast<Env *>(*state);
  if (e) {
    e->big.close();
    delete e;
  }
  return 0;
}

Env *env_or_skip(void **state) {
  auto *e = static_cast<Env *>(*state);
  if (!e) {
    std::fprintf(stderr, "SKIP: real models not found in %s (run scripts/fetch-models)\n",
                 models_dir());
    skip();
  }
  if (!e->plugin) {
    std::fprintf(stderr,
                 "SKIP: the llguidance plugin is not built (it needs a newer cargo; see the cmake "
                 "output)\n");
    skip();
  }
  return e;
}

specinfer_constraint *open_constraint(Env *e, const char *kind, const char *grammar) {
  specinfer_constraint *c = nullptr;
  char *err = nullptr;
  const specinfer_status rc = specinfer_constraint_open(e->big.reg, "llguidance", nullptr,
                                                        e->big.target, kind, grammar, &c, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "constraint %s: %s\n", kind, err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);
  return c;
}

specinfer_drafter *open_drafter(Env *e, const char *plugin, const std::string &config) {
  specinfer_drafter *d = nullptr;
  char *err = nullptr;
  const specinfer_status rc =
      specinfer_drafter_open(e->big.reg, plugin, config.c_str(), e->big.target, &d, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "drafter %s: %s\n", plugin, err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);
  return d;
}

// The text of the tokens after the prompt, without end-of-generation tokens.
std::string generated_text(Env *e, const std::vector<int32_t> &tokens, size_t n_prompt) {
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(e->big.target, &info), SPECINFER_OK);
  std::vector<int32_t> gen;
  for (size_t i = n_prompt; i < tokens.size(); ++i)
    if (!std::binary_search(info.eog_tokens, info.eog_tokens + info.n_eog_tokens, tokens[i]))
      gen.push_back(tokens[i]);
  std::string text(gen.size() * 16 + 16, '\0');
  size_t n = 0;
  assert_int_equal(specinfer_target_detokenize(e->big.target, gen.data(), gen.size(), text.data(),
                                               text.size(), &n),
                   SPECINFER_OK);
  text.resize(n);
  return text;
}

size_t prompt_tokens(Env *e) {
  std::vector<int32_t> ids(1024);
  size_t n = 0;
  assert_int_equal(specinfer_target_tokenize(e->big.target, kPrompt, std::strlen(kPrompt), 1, 1,
                                             ids.data(), ids.size(), &n),
                   SPECINFER_OK);
  return n;
}

// Opens a constraint that must fail with `want` and a message containing `needle`.
void expect_refused(specinfer_registry *reg, const char *plugin, const char *config,
                    specinfer_target *t, const char *kind, const char *grammar, bool with_out,
                    specinfer_status want, const char *needle) {
  specinfer_constraint *c = nullptr;
  char *err = nullptr;
  const specinfer_status got = specinfer_constraint_open(reg, plugin, config, t, kind, grammar,
                                                         with_out ? &c : nullptr, &err);
  const bool ok = got == want && err && std::strstr(err, needle);
  if (!ok)
    std::fprintf(stderr, "got %s (%s), want %s with '%s'\n", specinfer_status_str(got),
                 err ? err : "no message", specinfer_status_str(want), needle);
  specinfer_free(err);
  assert_true(ok);
  assert_null(c);
}

void test_plugin_and_bad_input(void **state) {
  Env *e = env_or_skip(state);
  bool listed = false;
  for (int32_t i = 0; i < specinfer_registry_plugin_count(e->big.reg); ++i) {
    specinfer_plugin_info info{};
    info.struct_size = sizeof info;
    assert_int_equal(specinfer_registry_plugin_info(e->big.reg, i, &info), SPECINFER_OK);
    if (std::strcmp(info.name, "llguidance") == 0)
      listed = info.has_constraint && !info.has_target && !info.has_drafter;
  }
  assert_true(listed);

  specinfer_registry *reg = e->big.reg;
  specinfer_target *t = e->big.target;
  const char *llg = "llguidance";
  expect_refused(nullptr, llg, nullptr, t, "regex", "a", true, SPECINFER_ERR_INVALID_ARGUMENT,
                 "NULL");
  expect_refused(reg, llg, nullptr, t, nullptr, "a", true, SPECINFER_ERR_INVALID_ARGUMENT, "NULL");
  expect_refused(reg, llg, nullptr, t, "regex", "a", false, SPECINFER_ERR_INVALID_ARGUMENT, "out");
  expect_refused(reg, llg, nullptr, t, "xml", "<a/>", true, SPECINFER_ERR_UNSUPPORTED,
                 "unknown grammar kind 'xml'");
  expect_refused(reg, llg, "bogus=1", t, "regex", "a", true, SPECINFER_ERR_CONFIG, "bogus");
  expect_refused(reg, llg, nullptr, t, "json_schema", "{\"type\": ", true,
                 SPECINFER_ERR_INVALID_ARGUMENT, "json_schema does not compile");
  expect_refused(reg, llg, nullptr, t, "json_schema", "{\"type\": \"frobnicate\"}", true,
                 SPECINFER_ERR_INVALID_ARGUMENT, "does not compile");
  expect_refused(reg, llg, nullptr, t, "regex", "(ab", true, SPECINFER_ERR_INVALID_ARGUMENT,
                 "regex does not compile");
  expect_refused(reg, llg, nullptr, t, "lark", "start: undefined_rule", true,
                 SPECINFER_ERR_INVALID_ARGUMENT, "lark does not compile");
  expect_refused(reg, "ngram", nullptr, t, "regex", "a", true, SPECINFER_ERR_NOT_FOUND,
                 "provides no constraints");

  // One constraint, one session at a time; not destroyed while used; a session refuses a
  // constraint of another vocabulary.
  specinfer_constraint *c = open_constraint(e, "regex", "[a-z]+");
  specinfer_session *s1 = nullptr, *s2 = nullptr;
  assert_int_equal(specinfer_session_create(t, nullptr, nullptr, nullptr, &s1, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_set_constraint(nullptr, c), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_set_constraint(s1, c), SPECINFER_OK);
  assert_int_equal(specinfer_constraint_destroy(c), SPECINFER_ERR_STATE);
  assert_non_null(std::strstr(specinfer_constraint_errmsg(c), "used by a session"));
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_ERR_STATE);
  specinfer_target *t2 = nullptr;
  assert_int_equal(specinfer_target_share(t, &t2, nullptr), SPECINFER_OK);
  assert_int_equal(specinfer_session_create(t2, nullptr, nullptr, nullptr, &s2, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_set_constraint(s2, c), SPECINFER_ERR_STATE);
  assert_int_equal(specinfer_session_set_constraint(s1, nullptr), SPECINFER_OK);
  // A target sharing the model speaks its vocabulary: the constraint moves to its session.
  assert_int_equal(specinfer_session_set_constraint(s2, c), SPECINFER_OK);
  specinfer_session_destroy(s2);
  specinfer_session_destroy(s1);
  assert_int_equal(specinfer_target_destroy(t2), SPECINFER_OK);

  const std::string gemma = std::string(models_dir()) + "/gemma-3-270m.gguf";
  if (is_regular_file(gemma.c_str())) {
    specinfer_target *g = nullptr;
    const std::string cfg = "path=" + gemma + ",n_ctx=256";
    assert_int_equal(specinfer_target_open(reg, "gguf", cfg.c_str(), &g, nullptr), SPECINFER_OK);
    specinfer_session *sg = nullptr;
    assert_int_equal(specinfer_session_create(g, nullptr, nullptr, nullptr, &sg, nullptr),
                     SPECINFER_OK);
    assert_int_equal(specinfer_session_set_constraint(sg, c), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(specinfer_session_errmsg(sg), "vocabulary"));
    specinfer_session_destroy(sg);
    assert_int_equal(specinfer_target_destroy(g), SPECINFER_OK);
  }
  assert_int_equal(specinfer_constraint_destroy(c), SPECINFER_OK);
  assert_int_equal(specinfer_constraint_destroy(nullptr), SPECINFER_OK);
}

// The schema, checked by hand on the parsed output.
void expect_valid(const std::string &text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception &ex) {
    std::fprintf(stderr, "not JSON (%s): %s\n", ex.what(), text.c_str());
    fail();
  }
  const bool ok =
      j.is_object() && j.size() == 4 && j.contains("name") && j["name"].is_string() &&
      j["name"].get<std::string>().size() <= 24 && j.contains("age") &&
      j["age"].is_number_integer() && j["age"].get<int>() >= 18 && j["age"].get<int>() <= 99 &&
      j.contains("languages") && j["languages"].is_array() && !j["languages"].empty() &&
      j["languages"].size() <= 3 && j.contains("senior") && j["senior"].is_boolean() &&
      std::all_of(j["languages"].begin(), j["languages"].end(), [](const nlohmann::json &l) {
        return l == "python" || l == "rust" || l == "go" || l == "c";
      });
  if (!ok) std::fprintf(stderr, "does not satisfy the schema: %s\n", text.c_str());
  assert_true(ok);
}

void test_json_schema_exact_under_speculation(void **state) {
  Env *e = env_or_skip(state);
  specinfer_constraint *c = open_constraint(e, "json_schema", kSchema);
  const size_t n_prompt = prompt_tokens(e);
  const int n = 64;
  RunParams rp;
  rp.constraint = c;
  specinfer_session_stats plain_st;
  const std::vector<int32_t> plain = run_session(e->big.target, nullptr, kPrompt, n, rp, &plain_st);
  const std::string text = generated_text(e, plain, n_prompt);
  std::fprintf(stderr, "constrained greedy output: %s\n", text.c_str());
  expect_valid(text);
  // The text ended with the grammar, not at the token budget.
  assert_true(plain.size() - n_prompt < static_cast<size_t>(n));
  // Forced tokens, without a drafter: several tokens per pass, most of them kept.
  std::fprintf(stderr, "plain: %lld tokens in %lld rounds, %lld forced drafted, %lld kept\n",
               (long long)plain_st.n_generated, (long long)plain_st.n_rounds,
               (long long)plain_st.n_forced_drafted, (long long)plain_st.n_forced_accepted);
  assert_true(plain_st.n_forced_accepted > 0);
  assert_true(plain_st.n_rounds < plain_st.n_generated);
  assert_true(plain_st.n_drafted == 0);
  // The constraint's own time per generated token beside the time of a target pass.
  const double per_token = plain_st.t_constraint_ms / static_cast<double>(plain_st.n_generated);
  const double per_pass = plain_st.t_verify_ms / static_cast<double>(plain_st.n_rounds);
  std::fprintf(stderr,
               "constraint time: %.3f ms per generated token; target pass: %.1f ms (%.2f%%)\n",
               per_token, per_pass, 100.0 * per_token / per_pass);

  specinfer_drafter *model = open_drafter(e, "draft-model", "path=" + e->draft);
  specinfer_drafter *ngram = open_drafter(e, "ngram", "");
  for (specinfer_drafter *d : {model, ngram}) {
    specinfer_session_stats st;
    const std::vector<int32_t> spec = run_session(e->big.target, d, kPrompt, n, rp, &st);
    expect_same_tokens(plain, spec, d == model ? "greedy, draft-model" : "greedy, ngram", kPrompt);
    std::fprintf(stderr, "%s: %lld rounds, %lld drafted, %lld kept, %lld forced, %lld kept\n",
                 d == model ? "draft-model" : "ngram", (long long)st.n_rounds,
                 (long long)st.n_drafted, (long long)st.n_accepted, (long long)st.n_forced_drafted,
                 (long long)st.n_forced_accepted);
    assert_true(st.n_forced_accepted > 0);
    if (d == model) assert_true(st.n_accepted > 0);
  }

  // Sampling with the gumbel coupler: identical to plain decoding at the same seed.
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  rp.coupler = gumbel;
  rp.temperature = 0.9f;
  rp.seed = 424242;
  const std::vector<int32_t> sampled = run_session(e->big.target, nullptr, kPrompt, n, rp);
  const std::string sampled_text = generated_text(e, sampled, n_prompt);
  std::fprintf(stderr, "constrained gumbel output: %s\n", sampled_text.c_str());
  expect_valid(sampled_text);
  for (specinfer_drafter *d : {model, ngram}) {
    const std::vector<int32_t> spec = run_session(e->big.target, d, kPrompt, n, rp);
    expect_same_tokens(sampled, spec, d == model ? "gumbel, draft-model" : "gumbel, ngram",
                       kPrompt);
  }
  specinfer_coupler_destroy(gumbel);
  // Rejection sampling with the draft model's q rows, which the session masks and renormalizes
  // before the coupler checks and uses them: the text satisfies the schema, drafts are kept.
  rp.coupler = nullptr;
  specinfer_session_stats rej_st;
  const std::vector<int32_t> rejected = run_session(e->big.target, model, kPrompt, n, rp, &rej_st);
  const std::string rejected_text = generated_text(e, rejected, n_prompt);
  std::fprintf(stderr, "constrained rejection sampling, draft-model: %s (%lld of %lld kept)\n",
               rejected_text.c_str(), (long long)rej_st.n_accepted, (long long)rej_st.n_drafted);
  expect_valid(rejected_text);
  assert_true(rej_st.n_accepted > 0);
  assert_int_equal(specinfer_drafter_destroy(model), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(ngram), SPECINFER_OK);
  assert_int_equal(specinfer_constraint_destroy(c), SPECINFER_OK);
}

// Compact JSON (no free whitespace): the keys, quotes and separators are forced, so most tokens
// are the session's own drafts, kept; with a drafter too, and the output is plain decoding's.
void test_forced_tokens(void **state) {
  Env *e = env_or_skip(state);
  std::string schema = kSchema;
  schema.insert(schema.rfind('}'), R"(, "x-guidance": {"whitespace_flexible": false})");
  specinfer_constraint *c = open_constraint(e, "json_schema", schema.c_str());
  const size_t n_prompt = prompt_tokens(e);
  RunParams rp;
  rp.constraint = c;
  specinfer_session_stats plain_st, spec_st;
  const std::vector<int32_t> plain =
      run_session(e->big.target, nullptr, kPrompt, 64, rp, &plain_st);
  const std::string text = generated_text(e, plain, n_prompt);
  std::fprintf(stderr, "compact: %s\n%lld tokens in %lld passes, %lld forced drafted, %lld kept\n",
               text.c_str(), (long long)plain_st.n_generated, (long long)plain_st.n_rounds,
               (long long)plain_st.n_forced_drafted, (long long)plain_st.n_forced_accepted);
  expect_valid(text);
  assert_true(text.find(' ') == std::string::npos || text.find("\": ") == std::string::npos);
  // A third of the text or more is forced (keys, quotes, brackets) and kept: a plain session
  // takes that many passes fewer.
  assert_true(plain_st.n_forced_accepted * 3 >= plain_st.n_generated);
  // Each pass emits a token of the target's choosing after the forced ones it kept (but where
  // the grammar ends: nothing comes after its last token).
  assert_true(plain_st.n_rounds + plain_st.n_forced_accepted >= plain_st.n_generated);
  specinfer_drafter *model = open_drafter(e, "draft-model", "path=" + e->draft);
  const std::vector<int32_t> spec = run_session(e->big.target, model, kPrompt, 64, rp, &spec_st);
  expect_same_tokens(plain, spec, "compact JSON, draft-model", kPrompt);
  std::fprintf(
      stderr, "draft-model: %lld passes, %lld drafted, %lld kept, %lld forced, %lld kept\n",
      (long long)spec_st.n_rounds, (long long)spec_st.n_drafted, (long long)spec_st.n_accepted,
      (long long)spec_st.n_forced_drafted, (long long)spec_st.n_forced_accepted);
  assert_int_equal(specinfer_drafter_destroy(model), SPECINFER_OK);

  // Two sessions stepped together (one plain, one with the draft model), each on a fork of the
  // constraint: each emits plain decoding's tokens, and forced tokens are drafted in the shared
  // passes too.
  specinfer_drafter *batch_model = open_drafter(e, "draft-model", "path=" + e->draft);
  specinfer_target *shared = nullptr;
  assert_int_equal(specinfer_target_share(e->big.target, &shared, nullptr), SPECINFER_OK);
  std::vector<specinfer_session *> sessions(2, nullptr);
  std::vector<specinfer_constraint *> forks(2, nullptr);
  for (size_t i = 0; i < 2; ++i) {
    specinfer_session_params sp;
    specinfer_session_params_init(&sp);
    assert_int_equal(specinfer_session_create(i ? e->big.target : shared, i ? batch_model : nullptr,
                                              nullptr, &sp, &sessions[i], nullptr),
                     SPECINFER_OK);
    assert_int_equal(specinfer_constraint_fork(c, &forks[i], nullptr), SPECINFER_OK);
    assert_int_equal(specinfer_session_set_constraint(sessions[i], forks[i]), SPECINFER_OK);
    assert_int_equal(specinfer_session_feed_text(sessions[i], kPrompt, std::strlen(kPrompt)),
                     SPECINFER_OK);
  }
  std::vector<std::vector<int32_t>> got(2);
  std::vector<size_t> want(2, 64);  // a session whose text ended wants no more
  specinfer_step_params params;
  specinfer_step_params_init(&params);
  step_together(sessions, got, want, params, 200,
                [&](int, size_t i, const specinfer_step_result &r) {
                  if (r.done) want[i] = got[i].size();
                });
  for (size_t i = 0; i < 2; ++i) {
    const int32_t *toks = nullptr;
    size_t len = 0;
    assert_int_equal(specinfer_session_tokens(sessions[i], &toks, &len), SPECINFER_OK);
    expect_same_tokens(plain, std::vector<int32_t>(toks, toks + len),
                       i ? "compact JSON in a batch, draft-model" : "compact JSON in a batch",
                       kPrompt);
    specinfer_session_stats st;
    specinfer_session_stats_init(&st);
    assert_int_equal(specinfer_session_get_stats(sessions[i], &st), SPECINFER_OK);
    std::fprintf(stderr, "in a batch, session %zu: %lld passes, %lld forced drafted, %lld kept\n",
                 i, (long long)st.n_rounds, (long long)st.n_forced_drafted,
                 (long long)st.n_forced_accepted);
    assert_true(st.n_forced_accepted * 3 >= st.n_generated);
    specinfer_session_destroy(sessions[i]);
    assert_int_equal(specinfer_constraint_destroy(forks[i]), SPECINFER_OK);
  }
  assert_int_equal(specinfer_drafter_destroy(batch_model), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(shared), SPECINFER_OK);
  assert_int_equal(specinfer_constraint_destroy(c), SPECINFER_OK);
}

// A regular expression and a Lark grammar: the whole text matches; a fork goes on from its
// parent's state without compiling again.
void test_regex_and_lark(void **state) {
  Env *e = env_or_skip(state);
  const char *prompt = "<|im_start|>user\nWhat is today's date?<|im_end|>\n<|im_start|>assistant\n";
  std::vector<int32_t> ids(256);
  size_t n_prompt = 0;
  assert_int_equal(specinfer_target_tokenize(e->big.target, prompt, std::strlen(prompt), 1, 1,
                                             ids.data(), ids.size(), &n_prompt),
                   SPECINFER_OK);
  const char *date = "20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  specinfer_constraint *rx = open_constraint(e, "regex", date);
  specinfer_constraint *fork = nullptr;
  assert_int_equal(specinfer_constraint_fork(rx, &fork, nullptr), SPECINFER_OK);
  for (specinfer_constraint *c : {rx, fork}) {
    RunParams rp;
    rp.constraint = c;
    const std::vector<int32_t> out = run_session(e->big.target, nullptr, prompt, 16, rp);
    const std::string text = generated_text(e, out, n_prompt);
    std::fprintf(stderr, "regex output: %s\n", text.c_str());
    assert_true(std::regex_match(text, std::regex(date)));
  }
  const char *lark =
      "start: \"The answer is \" ANSWER \".\"\nANSWER: \"yes\" | \"no\" | \"maybe\"\n";
  specinfer_constraint *g = open_constraint(e, "lark", lark);
  RunParams rp;
  rp.constraint = g;
  const std::vector<int32_t> out = run_session(e->big.target, nullptr, prompt, 16, rp);
  const std::string text = generated_text(e, out, n_prompt);
  std::fprintf(stderr, "lark output: %s\n", text.c_str());
  assert_true(text == "The answer is yes." || text == "The answer is no." ||
              text == "The answer is maybe.");
  for (specinfer_constraint *c : {rx, fork, g})
    assert_int_equal(specinfer_constraint_destroy(c), SPECINFER_OK);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plugin_and_bad_input),
      cmocka_unit_test(test_json_schema_exact_under_speculation),
      cmocka_unit_test(test_forced_tokens),
      cmocka_unit_test(test_regex_and_lark),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
