// Medusa heads: K small residual blocks on the target's last hidden state h (the input of its
// output layer), head k predicting the token k + 1 places past the one h's own logits choose:
//   y_k = h + silu(W_k x + b_k),  logits_k = U y_k,
// with U the target's own output rows for a truncated vocabulary (the tokens the target chose on
// the training corpus), fetched from the target at load time and never stored in the heads file.
// The input x is h followed by token inputs, each the target's output row of a token scaled by
// token_row() (e(t)):
//  - token_inputs = 0: x = h.
//  - 1: x = [h, e(a)], a the token h's logits chose (the last token of the context when the
//    drafter runs): it is known before any head runs, and telling the heads which it is spares
//    them from guessing it, which is most of what a head predicting the token after it gets wrong.
//  - 2: head k reads x = [h, e(p_{k-1}), e(p_k)], the last two tokens of the path before the
//    token it predicts (p_{-1} the context's last token but one, p_0 its last, p_j the drafted
//    token at depth j): each head knows the path it extends, so the drafter runs them one after
//    another down the path.
//
// The heads file is GGUF (general.architecture = "medusa-heads"): the weights, the truncated
// vocabulary, the held-out accuracy of each head by candidate rank (what the drafter's tree uses
// as acceptance estimates), and the identity of the target it was trained for, so that a file
// made for another model is refused with a message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "specinfer_plugin.h"

namespace medusa {

// Candidate ranks whose held-out accuracy is recorded per head.
constexpr int32_t kRanks = 16;

struct TargetIdentity {
  std::string name, arch;  // specinfer_model_info name and arch
  int32_t vocab_size = 0, hidden_size = 0;
  // A hash of the bit patterns of a few of the target's output rows (output_rows of fixed ids):
  // two models of the same shape but other weights differ here.
  uint64_t fingerprint = 0;
};

struct Heads {
  TargetIdentity target;
  int32_t n_heads = 0;
  int32_t hidden_size = 0;
  int32_t token_inputs = 0;    // 0, 1 or 2 (above)
  std::vector<int32_t> vocab;  // truncated vocabulary: target token ids, [n_vocab]
  std::vector<float> w;        // [n_heads][hidden_size][input_size()], row-major (W_k x)
  std::vector<float> b;        // [n_heads][hidden_size]
  // [n_heads][kRanks]: on held-out text, among the positions where the text follows the target's
  // greedy path up to the token head k predicts (each token in between was the target's top-1, as
  // in a draft tree whose parent path was accepted), the share where head k's rank-r candidate was
  // the target's top-1. Zero until evaluated.
  std::vector<float> accuracy;
  int64_t trained_tokens = 0;  // corpus tokens the heads were trained on

  int32_t n_vocab() const { return static_cast<int32_t>(vocab.size()); }
  int32_t input_size() const { return (1 + token_inputs) * hidden_size; }
};

// Scales a target output row in place to the token input e: unit root-mean-square (the rows'
// own norms vary with token frequency, which the heads should not have to undo).
void token_row(float *row, int32_t hidden_size);

// Reads the identity of `target` (info and output_rows); throws specinfer_plugin::Failure
// (UNSUPPORTED when the target has no output_rows).
TargetIdentity identify_target(const specinfer_model_info &info,
                               const specinfer_host_target &target);

// Writes / reads a heads file (written to a temporary file renamed into place; W stored as f16).
// Reading checks everything (magic, version, architecture, tensor shapes and types, sizes against
// the file's length, finite values, token ids inside the target's vocabulary) and throws
// specinfer_plugin::Failure with SPECINFER_ERR_NOT_FOUND (no such file), SPECINFER_ERR_IO (cannot
// open / read) or SPECINFER_ERR_FORMAT (anything malformed or truncated), the message naming the
// file and what is wrong.
void save_heads(const Heads &heads, const std::string &path);
Heads load_heads(const std::string &path);

// Throws Failure(SPECINFER_ERR_CONFIG) naming both models when `heads` was trained for another
// target than `id`.
void check_identity(const Heads &heads, const TargetIdentity &id, const std::string &path);

}  // namespace medusa
