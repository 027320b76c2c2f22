// Medusa head training's checkpoint file: the heads and their AdamW moments after each epoch, so
// that a rerun with the same data and settings continues after the last finished epoch.
#include <cstdio>
#include <cstring>

#include "train_internal.h"

namespace medusa::train_detail {
namespace {

constexpr char kCkptMagic[8] = {'M', 'E', 'D', 'U', 'S', 'A', 'C', '1'};

struct CkptHeader {
  char magic[8];
  uint64_t key;
  int64_t step;
  int32_t epochs_done;
  int32_t heads;
  int32_t hidden;
  int32_t reserved;
};

}  // namespace

uint64_t checkpoint_key(const Options &o, const Data &data, const std::vector<int32_t> &vocab,
                        uint64_t fingerprint) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv_value(h, fingerprint);
  h = fnv_value(h, data.n);
  h = fnv_value(h, data.n_heldout);
  h = fnv1a(h, data.token.data(), data.token.size() * sizeof(int32_t));
  h = fnv1a(h, vocab.data(), vocab.size() * sizeof(int32_t));
  for (double v : {double(o.heads), double(o.epochs), o.lr, o.wd, double(o.batch), o.warmup,
                   o.offpath, double(o.rank), double(o.token), double(o.seed)})
    h = fnv_value(h, v);
  return h;
}

void save_checkpoint(const std::string &path, uint64_t key, int32_t epochs_done, int64_t step,
                     const std::vector<Head> &heads, int32_t H) {
  const std::string tmp = path + ".tmp";
  FILE *f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    fail(SPECINFER_ERR_IO, "medusa: cannot write checkpoint '%s': %s", tmp.c_str(),
         std::strerror(errno));
  CkptHeader h{};
  std::memcpy(h.magic, kCkptMagic, sizeof kCkptMagic);
  h.key = key;
  h.step = step;
  h.epochs_done = epochs_done;
  h.heads = static_cast<int32_t>(heads.size());
  h.hidden = H;
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1;
  for (const Head &hd : heads)
    for (const Param *p : hd.params)
      for (const std::vector<float> *v : {&p->p, &p->m, &p->v})
        ok = ok && std::fwrite(v->data(), sizeof(float), v->size(), f) == v->size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(SPECINFER_ERR_IO, "medusa: cannot write checkpoint '%s'", path.c_str());
  }
}

int32_t load_checkpoint(const std::string &path, uint64_t key, std::vector<Head> &heads, int32_t H,
                        int64_t &step) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  CkptHeader h{};
  bool ok = std::fread(&h, sizeof h, 1, f) == 1 &&
            std::memcmp(h.magic, kCkptMagic, sizeof kCkptMagic) == 0 && h.key == key &&
            h.heads == static_cast<int32_t>(heads.size()) && h.hidden == H && h.epochs_done > 0;
  // Read into copies: a bad checkpoint leaves the fresh heads as they are.
  std::vector<std::vector<float>> values;
  for (Head &hd : heads)
    for (Param *p : hd.params)
      for (std::vector<float> *v : {&p->p, &p->m, &p->v}) {
        values.emplace_back(v->size());
        ok = ok && std::fread(values.back().data(), sizeof(float), v->size(), f) == v->size();
      }
  ok = ok && std::fgetc(f) == EOF;
  std::fclose(f);
  if (!ok) return 0;
  size_t i = 0;
  for (Head &hd : heads)
    for (Param *p : hd.params)
      for (std::vector<float> *v : {&p->p, &p->m, &p->v}) *v = std::move(values[i++]);
  step = h.step;
  return h.epochs_done;
}

}  // namespace medusa::train_detail
