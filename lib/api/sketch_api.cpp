// extern "C" shims for sketchers: pointer and size checks at the boundary, then lib/sketch;
// exceptions become a status plus *errmsg.
#include <cstring>
#include <memory>
#include <vector>

#include "api/guard.h"
#include "sketch/format.h"
#include "sketch/sketcher.h"
#include "specinfer.h"

using specinfer::fail;
using specinfer::guard;
namespace sk = specinfer::sketch;

struct specinfer_sketcher {
  std::unique_ptr<sk::Sketcher> impl;
};

namespace {

const sk::Sketcher &sketcher_of(const specinfer_sketcher *s) {
  if (!s || !s->impl) fail(SPECINFER_ERR_INVALID_ARGUMENT, "sketcher is NULL");
  return *s->impl;
}

sk::Role role_of(int32_t flags) {
  if (flags & ~SPECINFER_SKETCH_QUERY)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "unknown sketch flags 0x%x", static_cast<unsigned>(flags));
  return (flags & SPECINFER_SKETCH_QUERY) ? sk::Role::query : sk::Role::key;
}

void check_struct_size(uint32_t have, size_t need, const char *what) {
  if (have < need)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s.struct_size is %u, at least %zu expected", what, have,
         need);
}

}  // namespace

extern "C" {

SPECINFER_API specinfer_status specinfer_sketcher_create(const char *kind, int64_t dim,
                                                         int64_t size, uint64_t seed,
                                                         const char *options,
                                                         specinfer_sketcher **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!kind) fail(SPECINFER_ERR_INVALID_ARGUMENT, "kind is NULL");
    auto h = std::make_unique<specinfer_sketcher>();
    h->impl = sk::make_sketcher(kind, dim, size, seed, options ? options : "");
    *out = h.release();
  });
}

SPECINFER_API void specinfer_sketcher_destroy(specinfer_sketcher *sketcher) {
  delete sketcher;
}

SPECINFER_API specinfer_status specinfer_sketcher_get_info(const specinfer_sketcher *sketcher,
                                                           specinfer_sketcher_info *info) {
  return guard(nullptr, nullptr, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (!info) fail(SPECINFER_ERR_INVALID_ARGUMENT, "info is NULL");
    check_struct_size(info->struct_size, sizeof(specinfer_sketcher_info), "info");
    bool exact = false;
    info->kind = sk::kind_name(s.kind());
    info->dim = s.dim();
    info->size = s.size();
    info->seed = s.seed();
    info->key_bytes = s.bytes(sk::Role::key, &exact);
    info->query_bytes = s.bytes(sk::Role::query, &exact);
    info->fixed_size = exact ? 1 : 0;
    info->linear = s.linear() ? 1 : 0;
    info->simd = s.kernels().name;
  });
}

SPECINFER_API specinfer_status specinfer_sketcher_sketch_bytes(const specinfer_sketcher *sketcher,
                                                               int32_t flags, size_t *n_bytes,
                                                               int32_t *exact) {
  return guard(nullptr, nullptr, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (!n_bytes) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_bytes is NULL");
    bool e = false;
    const sk::Role role = role_of(flags);
    *n_bytes = s.bytes(s.kind() == sk::Kind::qjl ? role : sk::Role::key, &e);
    if (exact) *exact = e ? 1 : 0;
  });
}

SPECINFER_API specinfer_status specinfer_sketcher_sketch(const specinfer_sketcher *sketcher,
                                                         const float *x, size_t n, int32_t flags,
                                                         void *buf, size_t cap, size_t *n_bytes,
                                                         char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (!n_bytes) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_bytes is NULL");
    *n_bytes = 0;
    if (!x) fail(SPECINFER_ERR_INVALID_ARGUMENT, "x is NULL");
    if (n != s.dim())
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "vector has %zu elements, the sketcher's dimension is %u", n, s.dim());
    const sk::Role role = role_of(flags);
    std::vector<unsigned char> out;
    s.sketch(x, role, out);
    *n_bytes = out.size();
    if (cap < out.size() || !buf)
      fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "the sketch needs %zu bytes, the buffer has %zu",
           out.size(), buf ? cap : size_t{0});
    std::memcpy(buf, out.data(), out.size());
  });
}

SPECINFER_API specinfer_status specinfer_sketcher_sketch_rows(
    const specinfer_sketcher *sketcher, const float *rows, size_t n_rows, size_t row_stride,
    int32_t flags, void *buf, size_t cap, size_t *offsets, size_t *n_bytes, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (!n_bytes) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_bytes is NULL");
    *n_bytes = 0;
    if (n_rows > 0 && !rows) fail(SPECINFER_ERR_INVALID_ARGUMENT, "rows is NULL");
    if (n_rows > 0 && row_stride < s.dim())
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "row_stride %zu is less than the dimension %u",
           row_stride, s.dim());
    const sk::Role role = role_of(flags);
    std::vector<unsigned char> out;
    std::vector<size_t> offs;
    s.sketch_rows(rows, n_rows, row_stride, role, out, offs);
    *n_bytes = out.size();
    if (cap < out.size() || (!buf && !out.empty()))
      fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "the sketches need %zu bytes, the buffer has %zu",
           out.size(), buf ? cap : size_t{0});
    if (!out.empty()) std::memcpy(buf, out.data(), out.size());
    if (offsets) std::memcpy(offsets, offs.data(), offs.size() * sizeof(size_t));
  });
}

SPECINFER_API specinfer_status specinfer_sketcher_estimate(const specinfer_sketcher *sketcher,
                                                           const void *a, size_t a_len,
                                                           const void *b, size_t b_len,
                                                           double *estimate, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (!estimate) fail(SPECINFER_ERR_INVALID_ARGUMENT, "estimate is NULL");
    *estimate = 0.0;
    *estimate = s.estimate(a, a_len, b, b_len);
  });
}

SPECINFER_API specinfer_status specinfer_sketcher_estimate_many(
    const specinfer_sketcher *sketcher, const void *query, size_t query_len, const void *keys,
    const size_t *offsets, size_t n_keys, double *scores, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (n_keys > 0 && (!keys || !offsets || !scores))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "keys, offsets or scores is NULL");
    s.estimate_many(query, query_len, static_cast<const unsigned char *>(keys), offsets, n_keys,
                    scores);
  });
}

SPECINFER_API specinfer_status specinfer_sketcher_distance2(const specinfer_sketcher *sketcher,
                                                            const void *a, size_t a_len,
                                                            const void *b, size_t b_len,
                                                            double *distance2, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const sk::Sketcher &s = sketcher_of(sketcher);
    if (!distance2) fail(SPECINFER_ERR_INVALID_ARGUMENT, "distance2 is NULL");
    *distance2 = 0.0;
    *distance2 = s.distance2(a, a_len, b, b_len);
  });
}

SPECINFER_API specinfer_status specinfer_sketch_read_header(const void *bytes, size_t len,
                                                            specinfer_sketch_header *header,
                                                            char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!header) fail(SPECINFER_ERR_INVALID_ARGUMENT, "header is NULL");
    check_struct_size(header->struct_size, sizeof(specinfer_sketch_header), "header");
    const sk::View v = sk::parse_sketch(bytes, len);
    header->kind = sk::kind_name(v.h.kind);
    header->is_query = v.h.role == sk::Role::query ? 1 : 0;
    header->dim = v.h.dim;
    header->size = v.h.size;
    header->count = v.h.count;
    header->n_bytes = len;
  });
}

}  // extern "C"
