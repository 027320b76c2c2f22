// The gguf plugin through its ABI: the built specinfer-gguf.so is dlopen'ed, its target factory
// creates targets over a tiny GGUF model, and every vtable entry is exercised, including the
// error paths (config keys, missing files, bad arguments, small buffers) that must come back as
// status + message.
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/gguf/tiny_model.h"
#include "plugin/host.h"
#include "specinfer_plugin.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

using namespace gguf_test;

namespace {

struct Fixture {
  void *so = nullptr;
  const specinfer_target_factory *factory = nullptr;
  std::string model_path;
  TinyConfig cfg;
  TinyWeights w;
};

int setup(void **state) {
  auto *fx = new Fixture();
  const char *dir = std::getenv("SPECINFER_PLUGIN_PATH");
  std::string so = std::string(dir ? dir : "plugins") + "/specinfer-gguf.so";
  fx->so = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!fx->so) {
    print_error("dlopen %s: %s\n", so.c_str(), dlerror());
    delete fx;
    return -1;
  }
  auto *desc =
      static_cast<const specinfer_plugin_descriptor *>(dlsym(fx->so, "specinfer_plugin_entry"));
  if (!desc || desc->abi_version != SPECINFER_PLUGIN_ABI_VERSION ||
      std::strcmp(desc->name, "gguf") != 0) {
    delete fx;
    return -1;
  }
  fx->factory =
      static_cast<const specinfer_target_factory *>(desc->get_factory(SPECINFER_TARGET_FACTORY_ID));
  if (!fx->factory || desc->get_factory("specinfer.drafter-factory/1") != nullptr) {
    delete fx;
    return -1;
  }
  std::vector<uint8_t> bytes = make_tiny_model(fx->cfg, &fx->w);
  char path[] = "/tmp/test_gguf_plugin_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  close(fd);
  fx->model_path = path;
  if (!write_file(path, bytes)) return -1;
  *state = fx;
  return 0;
}

int teardown(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  if (fx == nullptr) return 0;  // setup failed (and said why)
  unlink(fx->model_path.c_str());
  dlclose(fx->so);
  delete fx;
  return 0;
}

specinfer_status create(Fixture *fx, const std::string &config, void **self,
                        const specinfer_target_vtable **vt, specinfer_plugin_error *err) {
  std::memset(err->message, 0, sizeof err->message);
  return fx->factory->create(specinfer::default_host(), config.c_str(), self, vt, err);
}

void test_config_errors(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  void *self = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  assert_int_equal(create(fx, "path=" + fx->model_path + ",colour=blue", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "colour"));
  assert_null(self);
  assert_int_equal(create(fx, "n_ctx=64", &self, &vt, &err), SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "path"));
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx=abc", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "n_ctx"));
  assert_int_equal(create(fx, "path=" + fx->model_path + ",n_ctx", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_int_equal(create(fx, "path=" + fx->model_path + ",requant=q5_0", &self, &vt, &err),
                   SPECINFER_ERR_CONFIG);
  assert_non_null(std::strstr(err.message, "requant"));
  // A valid requant on the tiny model loads (its F32 matrices become Q4_0) and runs a forward.
  assert_int_equal(create(fx, "path=" + fx->model_path + ",requant=q4_0", &self, &vt, &err),
                   SPECINFER_OK);
  assert_non_null(self);
  vt->destroy(self);
  self = nullptr;
  assert_int_equal(create(fx, "path=/nonexistent/model.gguf", &self, &vt, &err),
                   SPECINFER_ERR_NOT_FOUND);
  assert_non_null(std::strstr(err.message, "/nonexistent/model.gguf"));
  // A file that is not GGUF.
  assert_int_equal(create(fx, "path=/tmp", &self, &vt, &err), SPECINFER_ERR_IO);
  char notgguf[] = "/tmp/test_gguf_plugin_bad_XXXXXX";
  int fd = mkstemp(notgguf);
  assert_true(fd >= 0);
  assert_true(write(fd, "this is not a gguf file at all", 30) == 30);
  close(fd);
  assert_int_equal(create(fx, std::string("path=") + notgguf, &self, &vt, &err),
                   SPECINFER_ERR_FORMAT);
  assert_non_null(std::strstr(err.message, "magic"));
  unlink(notgguf);
  assert_null(self);
}

void test_target(void **state) {
  auto *fx = static_cast<Fixture *>(*state);
  void *self = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  specinfer_plugin_error err;
  assert_int_equal(create(fx, " path = " + fx->model_path + " , n_ctx=32", &self, &vt, &err),
                   SPECINFER_OK);
  assert_non_null(self);
  assert_true(vt->struct_size >= sizeof(specinfer_target_vtable));

  specinfer_model_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_int_equal(vt->info(self, &info), SPECINFER_OK);
  assert_int_equal(info.vocab_size, fx->cfg.n_vocab);
  assert_int_equal(info.n_ctx, 32);
  assert_int_equal(info.hidden_size, fx->cfg.n_embd);
  assert_int_equal(info.eos_token, 0);
  assert_int_equal(info.eot_token, 1);  // <|im_end|>
  assert_int_equal(info.add_bos, 0);
  assert_string_equal(info.arch, "qwen2");
  assert_string_equal(info.name, "tiny-qwen2");

  // Tokenize: single-byte tokens ('#' = id 2, ...), the special token parsed on request.
  const char *text = "#$<|im_end|>";
  int32_t toks[16];
  size_t n = 0;
  assert_int_equal(vt->tokenize(self, text, std::strlen(text), 0, 1, toks, 16, &n, &err),
                   SPECINFER_OK);
  assert_int_equal(n, 3);
  assert_int_equal(toks[0], 2);
  assert_int_equal(toks[1], 3);
  assert_int_equal(toks[2], 1);
  assert_int_equal(vt->tokenize(self, text, std::strlen(text), 0, 1, toks, 2, &n, &err),
                   SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(n, 3);
  assert_int_equal(vt->tokenize(self, nullptr, 5, 0, 1, toks, 16, &n, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);

  char buf[32];
  size_t nb = 0;
  assert_int_equal(vt->token_bytes(self, 2, buf, sizeof buf, &nb, &err), SPECINFER_OK);
  assert_int_equal(nb, 1);
  assert_int_equal(buf[0], '#');
  assert_int_equal(vt->token_bytes(self, 1, buf, 3, &nb, &err), SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(nb, std::strlen("<|im_end|>"));
  assert_int_equal(vt->token_bytes(self, 1000, buf, sizeof buf, &nb, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_true(std::strlen(err.message) > 0);

  // Forward through the vtable == the reference.
  const int nt = 5;
  int32_t ids[nt] = {4, 9, 17, 3, 30}, pos[nt] = {0, 1, 2, 3, 4};
  std::vector<float> logits(size_t(2) * size_t(fx->cfg.n_vocab)),
      hidden(size_t(2) * size_t(fx->cfg.n_embd));
  specinfer_forward_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.n_tokens = nt;
  b.tokens = ids;
  b.positions = pos;
  b.n_logits = 2;
  b.logits = logits.data();
  b.hidden = hidden.data();
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(self), nt);
  std::vector<double> ref;
  reference_forward(fx->cfg, fx->w, std::vector<int32_t>(ids, ids + nt),
                    std::vector<int32_t>(pos, pos + nt), causal_mask(nt), &ref, nullptr);
  double d = 0;
  for (int r = 0; r < 2; r++)
    for (int v = 0; v < fx->cfg.n_vocab; v++)
      d = std::max(d, std::fabs(double(logits[size_t(r * fx->cfg.n_vocab + v)]) -
                                ref[size_t((nt - 2 + r) * fx->cfg.n_vocab + v)]));
  assert_true(d < 1e-3);

  // Errors from forward and the cache calls.
  int32_t bad = 999;
  b.tokens = &bad;
  b.n_tokens = 1;
  b.n_logits = 1;
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err.message, "vocabulary"));
  b.struct_size = 8;
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(vt->forward(self, nullptr, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  int32_t keep_bad[] = {3, 1};
  assert_int_equal(vt->kv_keep(self, 0, keep_bad, 2, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  int32_t keep[] = {1, 3};
  assert_int_equal(vt->kv_keep(self, 1, keep, 2, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(self), 3);
  assert_int_equal(vt->kv_truncate(self, 1, &err), SPECINFER_OK);
  assert_int_equal(vt->kv_size(self), 1);
  assert_int_equal(vt->kv_truncate(self, -2, &err), SPECINFER_ERR_INVALID_ARGUMENT);

  // The context is 32: 40 tokens do not fit.
  std::vector<int32_t> many(40, 5), mpos(40);
  for (int i = 0; i < 40; i++) mpos[size_t(i)] = i + 1;
  b.struct_size = sizeof b;
  b.tokens = many.data();
  b.positions = mpos.data();
  b.n_tokens = 40;
  b.n_logits = 0;
  b.hidden = nullptr;
  assert_int_equal(vt->forward(self, &b, &err), SPECINFER_ERR_CONTEXT_FULL);
  assert_int_equal(vt->kv_size(self), 1);

  vt->destroy(self);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_target),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
