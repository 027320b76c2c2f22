//! The C side of llguidance that the specinfer plugin calls (declared in llg_bridge.h): a
//! vocabulary built from a target's token bytes, and matchers that compile a grammar for it and
//! answer, position by position, which tokens may come next.
//!
//! Every function catches panics and reports failures as a status plus a message written into
//! the caller's buffer; none unwinds into C. A matcher refuses a token its grammar does not allow
//! before consuming it, so a refused token leaves the matcher as it was.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

/// The target's tokenizer: writes the tokens of `len` bytes of UTF-8 text (no special tokens
/// added) to `out` (room for `cap`) and returns how many there are, which may exceed `cap`.
pub type LlgBridgeTokenizeFn =
    extern "C" fn(user: *const c_void, text: *const u8, len: usize, out: *mut u32, cap: usize) -> usize;

struct TargetTokenizer {
    trie: TokTrie,
    tokenize: LlgBridgeTokenizeFn,
    user: *const c_void,
}

// The plugin guarantees that `tokenize` may be called from any thread while the vocabulary lives
// (it calls the target's tokenize, which touches no sequence state).
unsafe impl Send for TargetTokenizer {}
unsafe impl Sync for TargetTokenizer {}

impl TargetTokenizer {
    fn tokenize_text(&self, s: &str) -> Vec<TokenId> {
        let mut out = vec![0u32; s.len() / 2 + 8];
        let mut n = (self.tokenize)(self.user, s.as_ptr(), s.len(), out.as_mut_ptr(), out.len());
        if n > out.len() {
            out.resize(n, 0);
            n = (self.tokenize)(self.user, s.as_ptr(), s.len(), out.as_mut_ptr(), out.len());
        }
        out.truncate(n.min(out.len()));
        out
    }
}

impl TokenizerEnv for TargetTokenizer {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    // Text goes through the target's own tokenizer (the tokens the target itself would see, so
    // that forced tokens are the canonical ones); bytes that are not UTF-8 fall back to the
    // longest-match tokenization of the vocabulary.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |t| self.tokenize_text(t))
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
    }
}

/// A vocabulary, compiled once for all the grammars over it.
pub struct LlgBridgeVocab {
    factory: Arc<ParserFactory>,
}

/// One grammar's state over a token sequence.
pub struct LlgBridgeMatcher {
    matcher: Matcher,
    vocab_size: usize,
}

fn write_message(buf: *mut c_char, cap: usize, msg: &str) {
    if buf.is_null() || cap == 0 {
        return;
    }
    let bytes = msg.as_bytes();
    let n = bytes.len().min(cap - 1);
    // SAFETY: the caller hands a buffer of `cap` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("llguidance panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("llguidance panicked: {s}")
    } else {
        "llguidance panicked".to_string()
    }
}

/// Runs `f`, turning an error or a panic into `fallback` and a message in `err`.
fn guarded<T>(err: *mut c_char, err_cap: usize, fallback: T, f: impl FnOnce() -> Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            write_message(err, err_cap, &format!("{e:#}"));
            fallback
        }
        Err(p) => {
            write_message(err, err_cap, &panic_text(p));
            fallback
        }
    }
}

fn c_text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    ensure!(!p.is_null(), "{what} is NULL");
    // SAFETY: a NUL-terminated string, as the header asks.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| anyhow!("{what} is not valid UTF-8"))
}

fn matcher_error(m: &Matcher) -> anyhow::Error {
    anyhow!(m.get_error().unwrap_or_else(|| "the grammar engine failed".to_string()))
}

/// Builds a vocabulary of `n_vocab` tokens: token i is the `lens[i]` bytes that follow token
/// i - 1's in `bytes` (a token whose bytes begin with 0xFF is special: no grammar text matches
/// it). `eos[0..n_eos)` end the text (n_eos >= 1). Returns NULL with a message on failure.
///
/// # Safety
/// `lens` holds n_vocab values, `bytes` their sum, `eos` n_eos; `err` has room for `err_cap`.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_vocab_new(
    n_vocab: u32,
    lens: *const u32,
    bytes: *const u8,
    eos: *const u32,
    n_eos: u32,
    tokenize: Option<LlgBridgeTokenizeFn>,
    tokenize_user: *const c_void,
    err: *mut c_char,
    err_cap: usize,
) -> *mut LlgBridgeVocab {
    guarded(err, err_cap, std::ptr::null_mut(), || {
        ensure!(n_vocab > 0 && !lens.is_null() && !bytes.is_null(), "empty vocabulary");
        ensure!(n_eos > 0 && !eos.is_null(), "no end-of-text token");
        let tokenize = tokenize.ok_or_else(|| anyhow!("no tokenize function"))?;
        let lens = std::slice::from_raw_parts(lens, n_vocab as usize);
        let total: usize = lens.iter().map(|&l| l as usize).sum();
        let bytes = std::slice::from_raw_parts(bytes, total);
        let eos = std::slice::from_raw_parts(eos, n_eos as usize);
        for &t in eos {
            ensure!(t < n_vocab, "end-of-text token {t} outside the vocabulary of {n_vocab}");
        }
        let mut words = Vec::with_capacity(n_vocab as usize);
        let mut at = 0usize;
        for &l in lens {
            words.push(bytes[at..at + l as usize].to_vec());
            at += l as usize;
        }
        let trie = TokTrie::from(&TokRxInfo::new(n_vocab, eos[0]), &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(TargetTokenizer { trie, tokenize, user: tokenize_user });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )?;
        factory.quiet();
        Ok(Box::into_raw(Box::new(LlgBridgeVocab { factory: Arc::new(factory) })))
    })
}

/// Frees a vocabulary (NULL: nothing). Matchers made from it keep what they need.
///
/// # Safety
/// `v` comes from llg_bridge_vocab_new and is freed once.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_vocab_free(v: *mut LlgBridgeVocab) {
    if !v.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(v))));
    }
}

/// Compiles a grammar of `kind` ("json_schema", "json_object", "regex", "lark") over `vocab`.
/// Returns NULL with a message when the kind is unknown or the grammar does not compile.
///
/// # Safety
/// `kind` and `text` are NUL-terminated; `err` has room for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_new(
    vocab: *const LlgBridgeVocab,
    kind: *const c_char,
    text: *const c_char,
    err: *mut c_char,
    err_cap: usize,
) -> *mut LlgBridgeMatcher {
    guarded(err, err_cap, std::ptr::null_mut(), || {
        ensure!(!vocab.is_null(), "vocabulary is NULL");
        let vocab = &*vocab;
        let kind = c_text(kind, "the grammar kind")?;
        let text = c_text(text, "the grammar")?;
        let grammar = match kind {
            "json_schema" | "json_object" | "regex" | "lark" => {
                TopLevelGrammar::from_tagged_str(kind, text)?
            }
            _ => bail!(
                "unknown grammar kind '{kind}' (known: json_schema, json_object, regex, lark)"
            ),
        };
        let parser = vocab.factory.create_parser(grammar)?;
        let matcher = Matcher::new(Ok(parser));
        if matcher.is_error() {
            return Err(matcher_error(&matcher));
        }
        let vocab_size = vocab.factory.tok_env().tok_trie().vocab_size();
        Ok(Box::into_raw(Box::new(LlgBridgeMatcher { matcher, vocab_size })))
    })
}

/// Frees a matcher (NULL: nothing).
///
/// # Safety
/// `m` comes from llg_bridge_matcher_new or _fork and is freed once.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_free(m: *mut LlgBridgeMatcher) {
    if !m.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(m))));
    }
}

/// A matcher in the same state that goes on on its own. NULL with a message on failure.
///
/// # Safety
/// `m` is a live matcher; `err` has room for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_fork(
    m: *const LlgBridgeMatcher,
    err: *mut c_char,
    err_cap: usize,
) -> *mut LlgBridgeMatcher {
    guarded(err, err_cap, std::ptr::null_mut(), || {
        ensure!(!m.is_null(), "matcher is NULL");
        let m = &*m;
        Ok(Box::into_raw(Box::new(LlgBridgeMatcher {
            matcher: m.matcher.deep_clone(),
            vocab_size: m.vocab_size,
        })))
    })
}

/// Writes the tokens allowed next as bits (token t: bit t % 32 of mask[t / 32]) into `n_words`
/// words, at most (vocabulary size + 31) / 32 of them (the first tokens' bits). Where the grammar
/// has ended only the end-of-text tokens are allowed. 0 on success, -1 with a message.
///
/// # Safety
/// `mask` has room for `n_words` words; `err` for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_mask(
    m: *mut LlgBridgeMatcher,
    mask: *mut u32,
    n_words: usize,
    err: *mut c_char,
    err_cap: usize,
) -> i32 {
    guarded(err, err_cap, -1, || {
        ensure!(!m.is_null() && !mask.is_null(), "NULL argument");
        let m = &mut *m;
        let most = m.vocab_size.div_ceil(32);
        ensure!(n_words <= most, "the mask has {n_words} words, the vocabulary {most}");
        let vob = m.matcher.compute_mask_or_eos().map_err(|_| matcher_error(&m.matcher))?;
        let words = vob.as_slice();
        ensure!(words.len() >= n_words, "the grammar engine's mask is too short");
        std::ptr::copy_nonoverlapping(words.as_ptr(), mask, n_words);
        Ok(0)
    })
}

/// Advances by one token: 0 when consumed, 1 when the grammar does not allow it here (nothing
/// changes), -1 with a message when the engine fails.
///
/// # Safety
/// `m` is a live matcher; `err` has room for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_consume(
    m: *mut LlgBridgeMatcher,
    token: u32,
    err: *mut c_char,
    err_cap: usize,
) -> i32 {
    guarded(err, err_cap, -1, || {
        ensure!(!m.is_null(), "matcher is NULL");
        let m = &mut *m;
        if token as usize >= m.vocab_size {
            return Ok(1);
        }
        let ok = m.matcher.validate_tokens(&[token]).map_err(|_| matcher_error(&m.matcher))?;
        if ok == 0 {
            return Ok(1);
        }
        m.matcher.consume_token(token).map_err(|_| matcher_error(&m.matcher))?;
        Ok(0)
    })
}

/// Takes back the last `n` consumed tokens. 0, or -1 with a message (more than were consumed).
///
/// # Safety
/// `m` is a live matcher; `err` has room for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_rollback(
    m: *mut LlgBridgeMatcher,
    n: usize,
    err: *mut c_char,
    err_cap: usize,
) -> i32 {
    guarded(err, err_cap, -1, || {
        ensure!(!m.is_null(), "matcher is NULL");
        let m = &mut *m;
        m.matcher.rollback(n).map_err(|_| matcher_error(&m.matcher))?;
        Ok(0)
    })
}

/// Writes up to `cap` tokens that the grammar forces from here (the only way on, tokenized as
/// the target tokenizes the text) and returns their number, or -1 with a message.
///
/// # Safety
/// `out` has room for `cap` tokens; `err` for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_forced(
    m: *mut LlgBridgeMatcher,
    out: *mut u32,
    cap: usize,
    err: *mut c_char,
    err_cap: usize,
) -> i32 {
    guarded(err, err_cap, -1, || {
        ensure!(!m.is_null() && (cap == 0 || !out.is_null()), "NULL argument");
        let m = &mut *m;
        let tokens = m.matcher.compute_ff_tokens();
        if m.matcher.is_error() {
            return Err(matcher_error(&m.matcher));
        }
        let n = tokens.len().min(cap);
        std::ptr::copy_nonoverlapping(tokens.as_ptr(), out, n);
        Ok(n as i32)
    })
}

/// Bit 1: the text so far is a whole sentence of the grammar (it may end here); bit 2: the
/// grammar has ended (nothing but the end of the text may follow). -1 with a message.
///
/// # Safety
/// `m` is a live matcher; `err` has room for `err_cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn llg_bridge_matcher_state(
    m: *mut LlgBridgeMatcher,
    err: *mut c_char,
    err_cap: usize,
) -> i32 {
    guarded(err, err_cap, -1, || {
        ensure!(!m.is_null(), "matcher is NULL");
        let m = &mut *m;
        if m.matcher.is_error() {
            return Err(matcher_error(&m.matcher));
        }
        let accepting = m.matcher.is_accepting().map_err(|_| matcher_error(&m.matcher))?;
        let stopped = m.matcher.is_stopped();
        Ok(i32::from(accepting) | (i32::from(stopped) << 1))
    })
}
