/* The C functions of the Rust crate in src/lib.rs (llguidance behind a narrow interface): a
 * vocabulary compiled from token bytes, and matchers of one grammar over it. Failures return
 * NULL or -1 and write a NUL-terminated message into err (room for err_cap bytes). */
#ifndef SPECINFER_LLG_BRIDGE_H
#define SPECINFER_LLG_BRIDGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct LlgBridgeVocab LlgBridgeVocab;
typedef struct LlgBridgeMatcher LlgBridgeMatcher;

/* The tokens of len bytes of UTF-8 text, as the target tokenizes it without special tokens:
 * writes at most cap into out and returns how many there are. */
typedef size_t (*llg_bridge_tokenize_fn)(const void *user, const uint8_t *text, size_t len,
                                         uint32_t *out, size_t cap);

/* Token i is the lens[i] bytes after token i - 1's in bytes; a token whose bytes begin with 0xFF
 * is special (no grammar text matches it). eos[0..n_eos) end the text. */
LlgBridgeVocab *llg_bridge_vocab_new(uint32_t n_vocab, const uint32_t *lens, const uint8_t *bytes,
                                     const uint32_t *eos, uint32_t n_eos,
                                     llg_bridge_tokenize_fn tokenize, const void *tokenize_user,
                                     char *err, size_t err_cap);
void llg_bridge_vocab_free(LlgBridgeVocab *vocab);

/* kind: "json_schema", "json_object", "regex" or "lark"; text NUL-terminated. */
LlgBridgeMatcher *llg_bridge_matcher_new(const LlgBridgeVocab *vocab, const char *kind,
                                         const char *text, char *err, size_t err_cap);
void llg_bridge_matcher_free(LlgBridgeMatcher *m);
LlgBridgeMatcher *llg_bridge_matcher_fork(const LlgBridgeMatcher *m, char *err, size_t err_cap);
/* Allowed next tokens into n_words <= (vocab + 31) / 32 words (the first tokens'). 0 or -1. */
int32_t llg_bridge_matcher_mask(LlgBridgeMatcher *m, uint32_t *mask, size_t n_words, char *err,
                                size_t err_cap);
/* 0 consumed, 1 not allowed (unchanged), -1 failed. */
int32_t llg_bridge_matcher_consume(LlgBridgeMatcher *m, uint32_t token, char *err, size_t err_cap);
int32_t llg_bridge_matcher_rollback(LlgBridgeMatcher *m, size_t n, char *err, size_t err_cap);
/* Forced tokens (at most cap) into out: their number, or -1. */
int32_t llg_bridge_matcher_forced(LlgBridgeMatcher *m, uint32_t *out, size_t cap, char *err,
                                  size_t err_cap);
/* Bit 1 accepting, bit 2 stopped; -1 failed. */
int32_t llg_bridge_matcher_state(LlgBridgeMatcher *m, char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif

#endif
