use std::ffi::CString;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;

use specinfer_sys as sys;

use crate::error::{check_msg, check_with, cstr, Code, Error, Result};
use crate::{live_dec, live_inc, Constraint, Coupler, Drafter, Target};

/// The most alternatives per token [`Session::set_logprobs`] keeps.
pub const MAX_TOP_LOGPROBS: usize = sys::SPECINFER_MAX_TOP_LOGPROBS as usize;

/// How a session samples and drafts. `Default` is the library's default (greedy, k = 8).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionParams {
    /// Most tokens drafted per round.
    pub max_draft: i32,
    /// Choose k each round from recent acceptance.
    pub adaptive_draft: bool,
    /// 0 = greedy; > 0 samples.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
    /// When the context window is full: drop the older half of the text after `n_keep` tokens
    /// and go on (true), or fail with `ContextFull` (false, the default).
    pub context_shift: bool,
    /// Tokens at the start a context shift keeps.
    pub n_keep: i32,
}

impl Default for SessionParams {
    fn default() -> Self {
        let mut p: sys::specinfer_session_params = unsafe { std::mem::zeroed() };
        unsafe { sys::specinfer_session_params_init(&mut p) };
        SessionParams {
            max_draft: p.max_draft,
            adaptive_draft: p.adaptive_draft != 0,
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            seed: p.seed,
            context_shift: p.context_shift != 0,
            n_keep: p.n_keep,
        }
    }
}

impl SessionParams {
    fn raw(&self) -> sys::specinfer_session_params {
        let mut p: sys::specinfer_session_params = unsafe { std::mem::zeroed() };
        unsafe { sys::specinfer_session_params_init(&mut p) };
        p.max_draft = self.max_draft;
        p.adaptive_draft = self.adaptive_draft as i32;
        p.temperature = self.temperature;
        p.top_k = self.top_k;
        p.top_p = self.top_p;
        p.min_p = self.min_p;
        p.seed = self.seed;
        p.context_shift = self.context_shift as i32;
        p.n_keep = self.n_keep;
        p
    }
}

/// What a session counted and timed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    pub n_prompt_tokens: i64,
    pub n_generated: i64,
    pub n_rounds: i64,
    pub n_target_passes: i64,
    pub n_drafted: i64,
    pub n_accepted: i64,
    pub acceptance_rate: f64,
    pub mean_accepted: f64,
    pub t_prefill_ms: f64,
    pub t_draft_ms: f64,
    pub t_verify_ms: f64,
    pub t_sample_ms: f64,
    pub t_total_ms: f64,
    pub tokens_per_second: f64,
    /// Context shifts (their scoring counts in `t_prefill_ms`).
    pub n_context_shifts: i64,
    /// With a constraint ([`Session::set_constraint`]): tokens it forced that the session
    /// drafted itself, and of them, kept.
    pub n_forced_drafted: i64,
    pub n_forced_accepted: i64,
    /// Time spent on the constraint: its masks and forced tokens, masking the scores.
    pub t_constraint_ms: f64,
    /// Positions of the text the first round after a feed found cached (from the text before,
    /// or from the target's last session) and did not score again.
    pub n_cached_tokens: i64,
    /// Rounds in which the drafter estimated how many of its nodes the target would keep, the
    /// sum of those estimates, and the drafted tokens kept in those rounds.
    pub n_estimated_rounds: i64,
    pub expected_accepted: f64,
    pub estimated_rounds_accepted: f64,
}

/// An emitted token's log-probability under the target ([`Session::step_logprobs`]), with its
/// most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: i32,
    pub logprob: f32,
    /// `(token, log-probability)`, most likely first (ties to the lower id).
    pub top: Vec<(i32, f32)>,
}

/// What one round emitted ([`Session::step_many`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    /// The tokens the round emitted: between 1 and max_draft + 1, or none while the session's
    /// prompt is still being scored in chunks ([`StepParams::prefill_chunk`]).
    pub tokens: Vec<i32>,
    /// The text ended: an end-of-generation token or a stop string.
    pub done: bool,
    /// The text of the tokens: whole UTF-8 characters (one split between rounds comes whole with
    /// the later round), nothing for end-of-generation tokens nor for what may begin a stop
    /// string ([`Session::set_stop_strings`]).
    pub text: String,
}

/// How [`Session::step_many_with`] runs. `Default` is the library's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepParams {
    /// Chunked prefill: a session whose prompt is not scored yet scores at most this many of its
    /// tokens per call (emitting nothing in that call), so a long prompt delays the others' tokens
    /// by a little per call rather than by a whole prefill. 0: the whole prompt at once.
    pub prefill_chunk: i32,
}

impl Default for StepParams {
    fn default() -> Self {
        let mut p: sys::specinfer_step_params = unsafe { std::mem::zeroed() };
        unsafe { sys::specinfer_step_params_init(&mut p) };
        StepParams { prefill_chunk: p.prefill_chunk }
    }
}

/// Generates text with a target, an optional drafter, an optional coupler and an optional
/// constraint, which it borrows for its whole life.
pub struct Session<'a> {
    ptr: *mut sys::specinfer_session,
    /// The most tokens a round emits: max_draft + 1.
    max_emit: usize,
    _borrows: PhantomData<Borrows<'a>>,
}

/// What a session borrows for its whole life.
type Borrows<'a> = (&'a mut Target, Option<&'a mut Drafter>, Option<&'a Coupler>, Option<&'a mut Constraint>);

// SAFETY: the session exclusively borrows its target, drafter and constraint (all Send) and
// shares a Sync coupler; the C session may be used from any one thread at a time.
unsafe impl Send for Session<'_> {}

struct Collect<'f> {
    f: &'f mut dyn FnMut(&[i32], &str) -> bool,
    panic: Option<Box<dyn std::any::Any + Send>>,
}

unsafe extern "C" fn on_tokens(
    user: *mut c_void,
    tokens: *const i32,
    n_tokens: usize,
    text: *const c_char,
    text_len: usize,
) -> c_int {
    let c = &mut *(user as *mut Collect<'_>);
    let toks = if n_tokens == 0 { &[][..] } else { std::slice::from_raw_parts(tokens, n_tokens) };
    let bytes = if text_len == 0 { &[][..] } else { std::slice::from_raw_parts(text.cast::<u8>(), text_len) };
    // The library hands over whole UTF-8 characters only.
    let s = String::from_utf8_lossy(bytes);
    match catch_unwind(AssertUnwindSafe(|| (c.f)(toks, &s))) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(p) => {
            c.panic = Some(p);
            1
        }
    }
}

impl<'a> Session<'a> {
    /// A session on `target`, drafting with `drafter` (None: plain decoding) and verifying with
    /// `coupler` (None: greedy when temperature is 0, else rejection sampling).
    pub fn new(
        target: &'a mut Target,
        drafter: Option<&'a mut Drafter>,
        coupler: Option<&'a Coupler>,
        params: &SessionParams,
    ) -> Result<Session<'a>> {
        let p = params.raw();
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_session_create(
                    target.raw(),
                    drafter.map_or(ptr::null_mut(), |d| d.ptr),
                    coupler.map_or(ptr::null(), |c| c.raw()),
                    &p,
                    &mut out,
                    &mut err,
                ),
                err,
            )?;
        }
        live_inc();
        Ok(Session { ptr: out, max_emit: params.max_draft.max(0) as usize + 1, _borrows: PhantomData })
    }

    fn errmsg(&self) -> String {
        unsafe { cstr(sys::specinfer_session_errmsg(self.ptr)) }
    }

    fn check(&self, st: sys::specinfer_status) -> Result<()> {
        check_with(st, || self.errmsg())
    }

    /// Appends prompt text.
    pub fn feed_text(&mut self, text: &str) -> Result<()> {
        let st = unsafe { sys::specinfer_session_feed_text(self.ptr, text.as_ptr().cast(), text.len()) };
        self.check(st)
    }

    /// Appends prompt tokens.
    pub fn feed_tokens(&mut self, tokens: &[i32]) -> Result<()> {
        let st = unsafe { sys::specinfer_session_feed_tokens(self.ptr, tokens.as_ptr(), tokens.len()) };
        self.check(st)
    }

    /// Feeds this empty session the first `n_tokens` tokens of `src`'s text (prompt and
    /// generated), `src` being a session on a target that shares this session's loaded model
    /// ([`Target::share`], or opened with the same plugin and config): the positions `src` has
    /// scored among them are copied into this session's cache rather than scored again, so that
    /// one prompt scored once serves several continuations (each session with its own seed,
    /// drafter and settings). A target plugin that cannot copy its cache leaves them to be scored
    /// at the next round, as [`Session::feed_tokens`] would. `src` does not change. Stop strings,
    /// constraint and log-probability settings stay this session's own.
    ///
    /// Errors: [`Code::State`] (this session has text already), [`Code::InvalidArgument`]
    /// (`n_tokens` outside 1 ..= `src`'s tokens, a target on another model), `ContextFull`.
    pub fn feed_from(&mut self, src: &Session<'_>, n_tokens: usize) -> Result<()> {
        // The C call reads src only; src is !Sync, so no other thread uses it meanwhile.
        let st = unsafe { sys::specinfer_session_feed_from(self.ptr, src.ptr, n_tokens) };
        self.check(st)
    }

    /// Makes the text the session generates from its next round on match `constraint` (None: no
    /// constraint). The constraint starts from its state when set, and each feed or reset takes
    /// it back there, so every generation after a prompt matches the grammar from its start. The
    /// target's scores of the tokens it rules out are masked before sampling and coupling: greedy
    /// text is the constrained plain text, sampled text follows the masked target distribution,
    /// whatever the drafter. The text ends where the grammar ends (or at an end-of-generation
    /// token it allows there); a further round fails with [`Code::State`] until the session is
    /// fed, reset or its constraint cleared.
    ///
    /// The session borrows the constraint for the rest of its life (also after clearing it), so
    /// the constraint outlives its use and serves one session at a time; it must have been opened
    /// for the session's target or a target sharing its model ([`Code::InvalidArgument`]
    /// otherwise).
    pub fn set_constraint(&mut self, constraint: Option<&'a mut Constraint>) -> Result<()> {
        let c = constraint.map_or(ptr::null_mut(), |c| c.ptr);
        let st = unsafe { sys::specinfer_session_set_constraint(self.ptr, c) };
        self.check(st)
    }

    /// Records, from the next round on, each emitted token's log-probability with its `top_n`
    /// (at most [`MAX_TOP_LOGPROBS`]) most likely alternatives ([`Session::step_logprobs`]);
    /// None turns it off (the default). They are the target's own: the log-softmax of its raw
    /// scores (no temperature, top-p or constraint applied), whatever the drafter and coupler
    /// chose. Costs a pass over the vocabulary per scored position while on. More than
    /// `MAX_TOP_LOGPROBS` is [`Code::InvalidArgument`].
    pub fn set_logprobs(&mut self, top_n: Option<usize>) -> Result<()> {
        let n = top_n.map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX));
        let st = unsafe { sys::specinfer_session_set_logprobs(self.ptr, n) };
        self.check(st)
    }

    /// The log-probabilities of the tokens the last round emitted ([`Session::step`] or
    /// `step_many`; after `generate`, its last round's): one per token, in order, each with the
    /// [`Session::set_logprobs`] number of alternatives. Empty when log-probabilities are off or
    /// the round only scored a prompt chunk.
    pub fn step_logprobs(&self) -> Result<Vec<TokenLogprob>> {
        self.logprobs(sys::specinfer_session_step_logprobs)
    }

    /// Records the log-probability of every token of the text fed (before or after this call),
    /// from its second token on, with `top_n` (at most [`MAX_TOP_LOGPROBS`]) alternatives each,
    /// as the next steps score the text (a prefix cached from an earlier text is scored again);
    /// None turns it off (the default). [`Session::prompt_logprobs`] reads them. More than
    /// `MAX_TOP_LOGPROBS` is [`Code::InvalidArgument`].
    pub fn set_prompt_logprobs(&mut self, top_n: Option<usize>) -> Result<()> {
        let n = top_n.map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX));
        let st = unsafe { sys::specinfer_session_set_prompt_logprobs(self.ptr, n) };
        self.check(st)
    }

    /// The text's log-probabilities scored so far ([`Session::set_prompt_logprobs`]): entry i is
    /// of the text's token i + 1; all of them once a round has run after the feed.
    pub fn prompt_logprobs(&self) -> Result<Vec<TokenLogprob>> {
        self.logprobs(sys::specinfer_session_prompt_logprobs)
    }

    fn logprobs(
        &self,
        f: unsafe extern "C" fn(
            *const sys::specinfer_session,
            *mut *const i32,
            *mut *const f32,
            *mut *const i32,
            *mut *const f32,
            *mut usize,
            *mut i32,
        ) -> sys::specinfer_status,
    ) -> Result<Vec<TokenLogprob>> {
        let (mut toks, mut lps): (*const i32, *const f32) = (ptr::null(), ptr::null());
        let (mut top_toks, mut top_lps): (*const i32, *const f32) = (ptr::null(), ptr::null());
        let (mut n, mut top_n) = (0usize, 0i32);
        self.check(unsafe { f(self.ptr, &mut toks, &mut lps, &mut top_toks, &mut top_lps, &mut n, &mut top_n) })?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let k = top_n.max(0) as usize;
        // SAFETY: the session owns n tokens and log-probabilities and n * k alternatives, valid
        // until its next call that changes it (this borrow of self rules that out).
        let (tokens, logprobs) = unsafe { (std::slice::from_raw_parts(toks, n), std::slice::from_raw_parts(lps, n)) };
        let (alt_tokens, alt_logprobs) = if k == 0 {
            (&[][..], &[][..])
        } else {
            unsafe { (std::slice::from_raw_parts(top_toks, n * k), std::slice::from_raw_parts(top_lps, n * k)) }
        };
        Ok((0..n)
            .map(|i| TokenLogprob {
                token: tokens[i],
                logprob: logprobs[i],
                top: (i * k..(i + 1) * k).map(|j| (alt_tokens[j], alt_logprobs[j])).collect(),
            })
            .collect())
    }

    /// Generates up to `max_tokens` tokens, calling `f(tokens, text)` after each round; `f`
    /// returns false to stop (the call then fails with [`Code::Cancelled`]).
    pub fn generate_with<F: FnMut(&[i32], &str) -> bool>(&mut self, max_tokens: i32, mut f: F) -> Result<()> {
        let mut c = Collect { f: &mut f, panic: None };
        let st = unsafe {
            sys::specinfer_session_generate(self.ptr, max_tokens, Some(on_tokens), (&mut c as *mut Collect<'_>).cast())
        };
        if let Some(p) = c.panic.take() {
            resume_unwind(p);
        }
        self.check(st)
    }

    /// Generates up to `max_tokens` tokens and returns their text.
    pub fn generate(&mut self, max_tokens: i32) -> Result<String> {
        let mut text = String::new();
        self.generate_with(max_tokens, |_, t| {
            text.push_str(t);
            true
        })?;
        Ok(text)
    }

    /// Stop strings: the text ends right before the first of them, across token and round
    /// boundaries, and none of one is ever returned (text that may begin one is held back until
    /// it cannot). Replaces the previous ones; an empty slice clears them. At most 64 strings of
    /// at most 1024 bytes; a string with a NUL byte is [`Code::InvalidArgument`].
    pub fn set_stop_strings(&mut self, stops: &[&str]) -> Result<()> {
        let owned = stops
            .iter()
            .enumerate()
            .map(|(i, s)| {
                CString::new(*s)
                    .map_err(|_| Error::new(Code::InvalidArgument, format!("stop string {i} holds a NUL byte")))
            })
            .collect::<Result<Vec<CString>>>()?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        let st = unsafe { sys::specinfer_session_set_stop_strings(self.ptr, ptrs.as_ptr(), ptrs.len()) };
        self.check(st)
    }

    /// The text of the last [`Session::step`]'s (or `step_many`'s) tokens: whole UTF-8
    /// characters, nothing of end-of-generation tokens or of what may begin a stop string.
    pub fn step_text(&self) -> Result<String> {
        let mut p: *const c_char = ptr::null();
        let mut n = 0usize;
        self.check(unsafe { sys::specinfer_session_step_text(self.ptr, &mut p, &mut n) })?;
        Ok(lossy(p, n))
    }

    /// Ends the text where the caller ends it (its own token budget): the tail held back because
    /// it could begin a stop string (empty when none).
    pub fn end_text(&mut self) -> Result<String> {
        let mut p: *const c_char = ptr::null();
        let mut n = 0usize;
        self.check(unsafe { sys::specinfer_session_end_text(self.ptr, &mut p, &mut n) })?;
        Ok(lossy(p, n))
    }

    /// An iterator over the generated text, one chunk (whole UTF-8 characters) per round, up to
    /// `max_tokens` tokens in all or the end of the text (an end-of-generation token or a stop
    /// string). Each `next()` runs one round.
    pub fn stream(&mut self, max_tokens: i32) -> TextStream<'_, 'a> {
        TextStream { session: self, left: max_tokens.max(0), finished: false }
    }

    /// Runs one speculate -> verify -> commit round emitting at most `cap` tokens (0 is
    /// [`Code::BufferTooSmall`]); returns them and whether the text ended (an end-of-generation
    /// token or a stop string). Their text: [`Session::step_text`].
    pub fn step(&mut self, cap: usize) -> Result<(Vec<i32>, bool)> {
        let mut buf = vec![0i32; cap.min(self.max_emit)];
        let mut n = 0usize;
        let mut done = 0i32;
        let st = unsafe { sys::specinfer_session_step(self.ptr, buf.as_mut_ptr(), buf.len(), &mut n, &mut done) };
        self.check(st)?;
        buf.truncate(n);
        Ok((buf, done != 0))
    }

    /// Runs one round of each session, as [`Session::step`] would, with one target pass for all
    /// sessions whose targets share a loaded model ([`Target::share`], or targets opened with the
    /// same plugin and config): the weights are read once for all of them. Each session emits
    /// exactly what its own `step` would. Continuous batching is a loop over this call with the
    /// sessions still generating; sessions may join and leave between calls.
    ///
    /// The outer `Err` is a call the library refused as a whole (nothing ran); otherwise each
    /// session has its own result, in order, and a failing session does not stop the others.
    /// (The library refuses a session given twice; here the borrow checker already does.) The
    /// sessions of one slice have one lifetime, so their targets stay borrowed until the last of
    /// them is dropped.
    pub fn step_many(sessions: &mut [&mut Session<'_>]) -> Result<Vec<Result<Step>>> {
        Session::step_many_with(sessions, &StepParams::default())
    }

    /// [`Session::step_many`] with [`StepParams`].
    pub fn step_many_with(sessions: &mut [&mut Session<'_>], params: &StepParams) -> Result<Vec<Result<Step>>> {
        // A status the library never writes: still there after the call, the session did not run.
        const UNSET: sys::specinfer_status = -1;
        let mut bufs: Vec<Vec<i32>> = sessions.iter().map(|s| vec![0i32; s.max_emit]).collect();
        let ptrs: Vec<*mut sys::specinfer_session> = sessions.iter().map(|s| s.ptr).collect();
        let mut results: Vec<sys::specinfer_step_result> = bufs
            .iter_mut()
            .map(|b| sys::specinfer_step_result {
                struct_size: std::mem::size_of::<sys::specinfer_step_result>() as u32,
                tokens: b.as_mut_ptr(),
                cap: b.len(),
                n_tokens: 0,
                done: 0,
                status: UNSET,
            })
            .collect();
        let mut p: sys::specinfer_step_params = unsafe { std::mem::zeroed() };
        unsafe { sys::specinfer_step_params_init(&mut p) };
        p.prefill_chunk = params.prefill_chunk;
        let st = unsafe { sys::specinfer_session_step_many(ptrs.as_ptr(), results.as_mut_ptr(), ptrs.len(), &p) };
        if st != sys::SPECINFER_OK && results.iter().all(|r| r.status == UNSET) {
            return Err(Error::new(
                Code::from_status(st),
                format!("step_many refused the call of {} sessions (nothing ran)", sessions.len()),
            ));
        }
        Ok(results
            .iter()
            .zip(bufs)
            .zip(sessions.iter())
            .map(|((r, mut buf), s)| {
                s.check(r.status)?;
                buf.truncate(r.n_tokens);
                Ok(Step { tokens: buf, done: r.done != 0, text: s.step_text()? })
            })
            .collect())
    }

    pub fn stats(&self) -> Result<Stats> {
        unsafe {
            let mut s: sys::specinfer_session_stats = std::mem::zeroed();
            sys::specinfer_session_stats_init(&mut s);
            self.check(sys::specinfer_session_get_stats(self.ptr, &mut s))?;
            Ok(Stats {
                n_prompt_tokens: s.n_prompt_tokens,
                n_generated: s.n_generated,
                n_rounds: s.n_rounds,
                n_target_passes: s.n_target_passes,
                n_drafted: s.n_drafted,
                n_accepted: s.n_accepted,
                acceptance_rate: s.acceptance_rate,
                mean_accepted: s.mean_accepted,
                t_prefill_ms: s.t_prefill_ms,
                t_draft_ms: s.t_draft_ms,
                t_verify_ms: s.t_verify_ms,
                t_sample_ms: s.t_sample_ms,
                t_total_ms: s.t_total_ms,
                tokens_per_second: s.tokens_per_second,
                n_context_shifts: s.n_context_shifts,
                n_forced_drafted: s.n_forced_drafted,
                n_forced_accepted: s.n_forced_accepted,
                t_constraint_ms: s.t_constraint_ms,
                n_cached_tokens: s.n_cached_tokens,
                n_estimated_rounds: s.n_estimated_rounds,
                expected_accepted: s.expected_accepted,
                estimated_rounds_accepted: s.estimated_rounds_accepted,
            })
        }
    }

    /// Forgets the text and the statistics.
    pub fn reset(&mut self) -> Result<()> {
        let st = unsafe { sys::specinfer_session_reset(self.ptr) };
        self.check(st)
    }

    /// The whole token sequence, prompt and generated.
    pub fn tokens(&self) -> Result<Vec<i32>> {
        let mut p: *const i32 = ptr::null();
        let mut n = 0usize;
        self.check(unsafe { sys::specinfer_session_tokens(self.ptr, &mut p, &mut n) })?;
        Ok(if n == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(p, n) }.to_vec() })
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        unsafe { sys::specinfer_session_destroy(self.ptr) };
        live_dec();
    }
}

/// The iterator of [`Session::stream`]: yields `Ok(text)` per round, or one `Err` and then ends.
pub struct TextStream<'s, 'a> {
    session: &'s mut Session<'a>,
    left: i32,
    finished: bool,
}

impl Iterator for TextStream<'_, '_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        while !self.finished && self.left > 0 {
            let round = self.session.step(self.left as usize).and_then(|(toks, done)| {
                self.left -= toks.len() as i32;
                self.finished = done;
                let mut text = self.session.step_text()?;
                if !done && self.left <= 0 {
                    text.push_str(&self.session.end_text()?);
                }
                Ok(text)
            });
            match round {
                Err(e) => {
                    self.finished = true;
                    return Some(Err(e));
                }
                Ok(text) if !text.is_empty() => return Some(Ok(text)),
                Ok(_) => {}
            }
        }
        None
    }
}

/// `n` bytes at `p` as text (invalid UTF-8 replaced; the library hands over whole characters).
fn lossy(p: *const c_char, n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }).into_owned()
    }
}
