// Training Medusa heads for a target by self-distillation: the labels are the target's own
// predictions on a text corpus, never the corpus text, so the heads learn what the target would
// say, which is what the drafter must guess.
//
//  1. Corpus. The files are visited in an order shuffled by `seed`; from each, a window of up to
//     `chunk` tokens starting at a line start (at a seeded offset) is one document. The first
//     documents, `heldout` tokens of them, are held out for evaluation; the following ones, up to
//     `tokens` in all, are trained on. The plan depends only on the file list, the files, the
//     seed, chunk and heldout, so a run with more tokens extends a run with fewer.
//  2. Collect. The target runs over each document with a fresh KV cache, returning logits and the
//     last hidden state h for every position; kept per position: h (f16), the target's top-8
//     tokens and their probabilities. Written chunk by chunk to OUT.data, which later runs reuse
//     (every stored document is checked against the plan token by token; collection resumes after
//     the last one that matches). Kept after success, so that training with other settings costs
//     no second collection; keep_data=0 removes it. With a time budget (minutes, default 15),
//     collection stops before the document whose pass would end the run past it: the time spent,
//     the document's pass (at the measured time per token) and training's cost on everything
//     collected with it. That cost is measured on this machine once the held-out documents and one
//     to train on are in: a probe runs the preparation (steps 3-4), one evaluation and one epoch
//     over up to 2048 positions at the full vocabulary size, a few seconds, and scales them to the
//     run's epochs and evaluations. So a slower machine trains on fewer tokens rather than for
//     longer; the log says where it stopped.
//  3. Vocabulary. The `vocab` tokens the target chose most often as its top-1 on the training
//     documents (ties: top-8 probability mass). U = the target's output rows for them.
//  4. Train. Head k (k = 0 .. heads-1) at position t learns the target's distribution at
//     t + k + 1 (its top-8, renormalized over the vocabulary): y = h + silu(W_k x + b_k), x = h
//     and `token` token inputs (heads.h) from the text: token=1, its token t + 1; token=2, its
//     tokens t + k and t + k + 1,
//     logits = U y, cross-entropy to those soft labels. W_k starts at zero, so every head starts
//     as the target's own next-token guess. AdamW on minibatches, linear warm-up then cosine decay
//     of the learning rate; heads run in parallel on the host's threads, their products in
//     OpenBLAS. After each epoch, heads and optimizer state go to OUT.ckpt; a rerun with the same
//     data and settings continues after the last finished epoch. OUT.ckpt is removed on success.
//  5. Evaluate (before training and after each epoch) on the held-out documents: for head k, at
//     every position t where the text follows the target's greedy path (tokens t+1 .. t+k+1 were
//     each the target's top-1; as in a draft tree whose parent path was accepted), the rank of the
//     target's top-1 at t+k+1 among the head's logits. Heads::accuracy[k][r] is the share of those
//     positions where it was rank r; progress reports rank 0 (top-1 agreement).
//
// Config (key=value,...; unknown keys are refused with SPECINFER_ERR_CONFIG):
//   heads=<1..16> (2)  tokens=<N> (196608; held-out included)  heldout=<N> (4096, at most half of
//   tokens)  minutes=<x> (15; 0 = no time budget)  vocab=<N> (8192)  epochs=<N> (2)  lr=<x>
//   (0.001)  wd=<x> (0.1, AdamW's decoupled weight decay)  batch=<N> (128)  warmup=<0..0.5> (0.05,
//   share of the steps)  chunk=<N> (512, tokens per document and forward pass)  offpath=<0..1> (1:
//   the weight of training positions whose text leaves the target's greedy path before the
//   predicted token; such positions do not occur in drafting)  rank=<0..2*hidden> (0: full-rank W;
//   r: W trained as a product of H x r and r x input factors, stored as the full W)  token=0|1|2
//   (1: token inputs, heads.h) seed=<N> (1)  resume=0|1 (1: reuse OUT.data and OUT.ckpt when they
//   match)  keep_data=0|1 (1)
#pragma once

#include "specinfer_plugin.h"

// The drafter factory's train function for Medusa heads (see above and specinfer_plugin.h).
specinfer_status medusa_train(const specinfer_host *host, const specinfer_train_params *params,
                              const specinfer_model_info *target_info,
                              const specinfer_host_target *target, specinfer_plugin_error *err);
