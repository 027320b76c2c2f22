// Between the token-tree builder (token_tree.h, no ABI types) and a tree drafter's request and
// draft (header-only): the session's pass costs into the builder's spec, the built tree into the
// draft.
#pragma once

#include <cstddef>
#include <cstdint>

#include "drafter_plugin.h"
#include "specinfer_plugin.h"
#include "token_tree.h"

namespace token_tree {

// The session's measured pass costs (specinfer_draft_request.pass_cost) as the spec's, when the
// host's request has them; otherwise none (the builder's default step per node).
inline void take_pass_cost(const specinfer_draft_request &req, TreeSpec &spec) {
  spec.pass_cost = nullptr;
  spec.n_pass_cost = 0;
  if (req.struct_size >= offsetof(specinfer_draft_request, n_pass_cost) + sizeof(req.n_pass_cost) &&
      req.pass_cost && req.n_pass_cost > 0) {
    spec.pass_cost = req.pass_cost;
    spec.n_pass_cost = req.n_pass_cost;
  }
}

// The tree as the draft: its tokens and parents (the caller's spec.max_nodes is at most the
// draft's cap), point masses, and the accepted length it expects.
inline void write_draft(const Tree &tree, specinfer_draft &out) {
  const auto n = static_cast<int32_t>(tree.tokens.size());
  for (int32_t j = 0; j < n; ++j) {
    out.tokens[j] = tree.tokens[static_cast<size_t>(j)];
    out.parents[j] = tree.parents[static_cast<size_t>(j)];
  }
  out.n_nodes = n;
  out.has_probs = 0;
  if (n > 0) specinfer_plugin::set_expected_accepted(out, tree.expected_tokens - 1.0);
}

}  // namespace token_tree
