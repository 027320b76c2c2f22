package specinfer

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"iter"
	"runtime"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// SessionParams are how a session samples and drafts; DefaultSessionParams gives the
// library's defaults (greedy, up to 8 drafted tokens per round, adaptive).
type SessionParams struct {
	MaxDraft      int
	AdaptiveDraft bool
	Temperature   float32 // 0 = greedy
	TopK          int
	TopP          float32
	MinP          float32
	Seed          uint64
	// ContextShift: when the context window is full, drop the older half of the text after
	// NKeep tokens and go on (else generation fails with ContextFull).
	ContextShift bool
	NKeep        int
}

// DefaultSessionParams returns the library's defaults.
func DefaultSessionParams() SessionParams {
	var p C.specinfer_session_params
	C.specinfer_session_params_init(&p)
	return SessionParams{
		MaxDraft: int(p.max_draft), AdaptiveDraft: p.adaptive_draft != 0, Temperature: float32(p.temperature),
		TopK: int(p.top_k), TopP: float32(p.top_p), MinP: float32(p.min_p), Seed: uint64(p.seed),
		ContextShift: p.context_shift != 0, NKeep: int(p.n_keep),
	}
}

// Stats is what a session counted and timed.
type Stats struct {
	NPromptTokens, NGenerated, NRounds, NTargetPasses, NDrafted, NAccepted int64
	AcceptanceRate, MeanAccepted                                           float64
	TPrefillMs, TDraftMs, TVerifyMs, TSampleMs, TTotalMs, TokensPerSecond  float64
	NContextShifts                                                         int64 // their scoring counts in TPrefillMs
	// With a constraint (SetConstraint): tokens it forced that the session drafted itself, and of
	// them, kept; the time spent on it (masks, forced tokens, masking the scores).
	NForcedDrafted, NForcedAccepted int64
	TConstraintMs                   float64
	// Positions of the text the first round after a feed found cached (from the text before, or
	// from the target's last session) and did not score again.
	NCachedTokens int64
	// Rounds in which the drafter estimated how many of its nodes the target would keep, the sum
	// of those estimates, and the drafted tokens kept in those rounds.
	NEstimatedRounds                          int64
	ExpectedAccepted, EstimatedRoundsAccepted float64
}

// Session generates text with a target, an optional drafter and an optional coupler.
type Session struct {
	ptr        *C.specinfer_session
	target     *Target
	drafter    *DrafterHandle
	coupler    *Coupler
	constraint *Constraint // SetConstraint's, kept reachable while the session may use it
	maxEmit    int         // the most tokens a round emits: MaxDraft + 1
}

// NewSession makes a session on target, drafting with drafter (nil: plain decoding) and
// verifying with coupler (nil: greedy when Temperature is 0, else rejection sampling). The
// session keeps all three reachable until it is closed.
func NewSession(target *Target, drafter *DrafterHandle, coupler *Coupler, params SessionParams) (*Session, error) {
	tp, err := target.raw()
	if err != nil {
		return nil, err
	}
	var p C.specinfer_session_params
	C.specinfer_session_params_init(&p)
	p.max_draft = C.int32_t(params.MaxDraft)
	p.adaptive_draft = cbool(params.AdaptiveDraft)
	p.temperature = C.float(params.Temperature)
	p.top_k = C.int32_t(params.TopK)
	p.top_p = C.float(params.TopP)
	p.min_p = C.float(params.MinP)
	p.seed = C.uint64_t(params.Seed)
	p.context_shift = cbool(params.ContextShift)
	p.n_keep = C.int32_t(params.NKeep)
	var dp *C.specinfer_drafter
	if drafter != nil {
		if drafter.ptr == nil {
			return nil, &Error{Code: InvalidArgument, Message: "the drafter is closed"}
		}
		dp = drafter.ptr
	}
	var cp *C.specinfer_coupler
	if coupler != nil {
		if coupler.ptr == nil {
			return nil, &Error{Code: InvalidArgument, Message: "the coupler is closed"}
		}
		cp = coupler.ptr
	}
	var out *C.specinfer_session
	var msg *C.char
	if err := checkMsg(C.specinfer_session_create(tp, dp, cp, &p, &out, &msg), msg); err != nil {
		return nil, err
	}
	live.Add(1)
	s := &Session{ptr: out, target: target, drafter: drafter, coupler: coupler,
		maxEmit: params.MaxDraft + 1}
	runtime.SetFinalizer(s, func(s *Session) { s.Close() })
	return s, nil
}

// Close frees the session (the target, drafter and coupler stay open).
func (s *Session) Close() error {
	if s.ptr == nil {
		return nil
	}
	C.specinfer_session_destroy(s.ptr)
	s.ptr = nil
	live.Add(-1)
	runtime.SetFinalizer(s, nil)
	return nil
}

func (s *Session) check(st C.specinfer_status) error {
	return checkWith(st, C.specinfer_session_errmsg(s.ptr))
}

func (s *Session) raw() (*C.specinfer_session, error) {
	if s == nil || s.ptr == nil {
		return nil, &Error{Code: InvalidArgument, Message: "the session is closed"}
	}
	return s.ptr, nil
}

// FeedText appends prompt text.
func (s *Session) FeedText(text string) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	return s.check(C.specinfer_session_feed_text(p, ct, C.size_t(len(text))))
}

// FeedTokens appends prompt tokens.
func (s *Session) FeedTokens(tokens []int32) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	return s.check(C.specinfer_session_feed_tokens(p, int32Ptr(tokens), C.size_t(len(tokens))))
}

// FeedFrom feeds this empty session the first nTokens tokens of src's text (prompt and
// generated), src being a session on a target that shares this session's loaded model
// (Target.Share, or opened with the same plugin and config): the positions src has scored among
// them are copied into this session's cache rather than scored again, so that one prompt scored
// once serves several continuations (each session with its own seed, drafter and settings). A
// target plugin that cannot copy its cache leaves them to be scored at the next round, as
// FeedTokens would. src does not change; no other goroutine may use either session meanwhile.
// Stop strings, constraint and log-probability settings stay this session's own.
// Errors: StateError (this session has text already), InvalidArgument (nTokens outside 1 ..
// src's tokens, a target on another model), ContextFull.
func (s *Session) FeedFrom(src *Session, nTokens int) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	sp, err := src.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	defer runtime.KeepAlive(src)
	if nTokens < 0 {
		return &Error{Code: InvalidArgument, Message: fmt.Sprintf("nTokens is negative (%d)", nTokens)}
	}
	return s.check(C.specinfer_session_feed_from(p, sp, C.size_t(nTokens)))
}

type tokenCallback struct {
	fn    func(tokens []int32, text string) bool
	panic any
}

//export goSpecinferOnTokens
func goSpecinferOnTokens(h C.uintptr_t, tokens *C.int32_t, n C.size_t, text *C.char, textLen C.size_t) C.int {
	cb := cgo.Handle(h).Value().(*tokenCallback)
	toks := make([]int32, int(n))
	if n > 0 {
		copy(toks, unsafe.Slice((*int32)(unsafe.Pointer(tokens)), int(n)))
	}
	str := C.GoStringN(text, C.int(textLen))
	goOn := false
	func() {
		defer func() {
			if r := recover(); r != nil {
				cb.panic = r
			}
		}()
		goOn = cb.fn(toks, str)
	}()
	if goOn {
		return 0
	}
	return 1
}

// GenerateFunc generates up to maxTokens tokens, calling fn(tokens, text) after each round;
// fn returns false to stop (GenerateFunc then returns an error with code Cancelled). text holds
// whole UTF-8 characters only.
func (s *Session) GenerateFunc(maxTokens int, fn func(tokens []int32, text string) bool) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	cb := &tokenCallback{fn: fn}
	h := cgo.NewHandle(cb)
	st := C.si_go_generate(p, C.int32_t(maxTokens), C.uintptr_t(h))
	h.Delete()
	if cb.panic != nil {
		panic(cb.panic)
	}
	return s.check(st)
}

// Generate generates up to maxTokens tokens and returns their text.
func (s *Session) Generate(maxTokens int) (string, error) {
	var text []byte
	err := s.GenerateFunc(maxTokens, func(_ []int32, t string) bool {
		text = append(text, t...)
		return true
	})
	return string(text), err
}

// Stream yields the generated text one chunk per round (whole UTF-8 characters), up to
// maxTokens tokens in all or the end of the text (an end-of-generation token or a stop string);
// after an error it yields ("", err) once and stops. Each step runs one round, so breaking out of
// the loop stops generating.
func (s *Session) Stream(maxTokens int) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		left := maxTokens
		for left > 0 {
			toks, done, err := s.Step(left)
			var text, tail string
			if err == nil {
				left -= len(toks)
				text, err = s.StepText()
			}
			if err == nil && !done && left <= 0 {
				tail, err = s.EndText()
			}
			if err != nil {
				yield("", err)
				return
			}
			if chunk := text + tail; len(chunk) > 0 && !yield(chunk, nil) {
				return
			}
			if done {
				return
			}
		}
	}
}

// Step runs one speculate -> verify -> commit round emitting at most limit tokens (0 is an
// error with code BufferTooSmall) and returns them and whether the text ended (an
// end-of-generation token or a stop string). Their text: StepText.
func (s *Session) Step(limit int) ([]int32, bool, error) {
	p, err := s.raw()
	if err != nil {
		return nil, false, err
	}
	defer runtime.KeepAlive(s)
	buf := make([]int32, max(min(limit, s.maxEmit), 1))
	var n C.size_t
	var done C.int32_t
	if err := s.check(C.specinfer_session_step(p, int32Ptr(buf), C.size_t(max(min(limit, s.maxEmit), 0)), &n, &done)); err != nil {
		return nil, false, err
	}
	return buf[:n], done != 0, nil
}

// SetStopStrings sets the strings that end the text: it ends right before the first of them,
// across token and round boundaries, and none of one is ever returned (text that may begin one is
// held back until it cannot). Replaces the previous ones; none clears them. At most 64 strings of
// at most 1024 bytes, without NUL bytes.
func (s *Session) SetStopStrings(stops []string) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	cs := make([]*C.char, len(stops)+1) // +1: a valid pointer for an empty list
	for i, x := range stops {
		if strings.IndexByte(x, 0) >= 0 {
			return &Error{Code: InvalidArgument, Message: fmt.Sprintf("stop string %d holds a NUL byte", i)}
		}
	}
	for i, x := range stops {
		cs[i] = C.CString(x)
		defer C.free(unsafe.Pointer(cs[i]))
	}
	return s.check(C.specinfer_session_set_stop_strings(p, &cs[0], C.size_t(len(stops))))
}

// MaxTopLogprobs is the most alternatives per token SetLogprobs keeps.
const MaxTopLogprobs = int(C.SPECINFER_MAX_TOP_LOGPROBS)

// SetLogprobs records, from the next round on, each emitted token's log-probability with its
// topN (0 to MaxTopLogprobs) most likely alternatives (StepLogprobs); -1 turns it off (the
// default). They are the target's own: the log-softmax of its raw scores (no temperature, top-p
// or constraint applied), whatever the drafter and coupler chose. Costs a pass over the
// vocabulary per scored position while on. Errors: InvalidArgument (topN outside -1 ..
// MaxTopLogprobs).
func (s *Session) SetLogprobs(topN int) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	if int(int32(topN)) != topN { // the library checks the range; C.int32_t would wrap this
		return &Error{Code: InvalidArgument, Message: fmt.Sprintf("topN must be in -1 .. %d, got %d", MaxTopLogprobs, topN)}
	}
	return s.check(C.specinfer_session_set_logprobs(p, C.int32_t(topN)))
}

// TokenLogprob is an emitted token's log-probability under the target, with its most likely
// alternatives, most likely first (ties to the lower id).
type TokenLogprob struct {
	Token   int32
	Logprob float32
	Top     []Alternative
}

// Alternative is one of the most likely tokens at a position, with its log-probability.
type Alternative struct {
	Token   int32
	Logprob float32
}

// StepLogprobs returns the log-probabilities of the tokens the last round emitted (Step, a
// StepMany call, or GenerateFunc's callback for its rounds): one per token, in order, each with
// the SetLogprobs number of alternatives. Empty when log-probabilities are off or the round only
// scored a prompt chunk.
func (s *Session) StepLogprobs() ([]TokenLogprob, error) {
	return s.logprobs(false)
}

// SetPromptLogprobs turns on (topN 0 .. MaxTopLogprobs alternatives) or off (-1) the
// log-probabilities of the text's own tokens: every token fed, from the second on, gets the
// target's log-probability after the tokens before it as the next steps score the text (a prefix
// cached from an earlier text is scored again). PromptLogprobs reads them. Errors:
// InvalidArgument (topN out of range).
func (s *Session) SetPromptLogprobs(topN int) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	if int(int32(topN)) != topN {
		return &Error{Code: InvalidArgument, Message: fmt.Sprintf("topN must be in -1 .. %d, got %d", MaxTopLogprobs, topN)}
	}
	return s.check(C.specinfer_session_set_prompt_logprobs(p, C.int32_t(topN)))
}

// PromptLogprobs returns the text's log-probabilities scored so far (SetPromptLogprobs): entry i
// is of the text's token i + 1; all of them once a round has run after the feed.
func (s *Session) PromptLogprobs() ([]TokenLogprob, error) {
	return s.logprobs(true)
}

// logprobs reads the text's (prompt) or the last round's log-probabilities.
func (s *Session) logprobs(prompt bool) ([]TokenLogprob, error) {
	p, err := s.raw()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(s)
	var toks, topToks *C.int32_t
	var lps, topLps *C.float
	var n C.size_t
	var topN C.int32_t
	var rc C.specinfer_status
	if prompt {
		rc = C.specinfer_session_prompt_logprobs(p, &toks, &lps, &topToks, &topLps, &n, &topN)
	} else {
		rc = C.specinfer_session_step_logprobs(p, &toks, &lps, &topToks, &topLps, &n, &topN)
	}
	if err := s.check(rc); err != nil {
		return nil, err
	}
	return tokenLogprobs(toks, lps, topToks, topLps, n, topN), nil
}

// tokenLogprobs copies n entries of the session's arrays (topN alternatives each).
func tokenLogprobs(toks *C.int32_t, lps *C.float, topToks *C.int32_t, topLps *C.float, n C.size_t, topN C.int32_t) []TokenLogprob {
	if n == 0 {
		return nil
	}
	k := max(int(topN), 0)
	tokens := unsafe.Slice((*int32)(unsafe.Pointer(toks)), int(n))
	logprobs := unsafe.Slice((*float32)(unsafe.Pointer(lps)), int(n))
	var altTokens []int32
	var altLogprobs []float32
	if k > 0 {
		altTokens = unsafe.Slice((*int32)(unsafe.Pointer(topToks)), int(n)*k)
		altLogprobs = unsafe.Slice((*float32)(unsafe.Pointer(topLps)), int(n)*k)
	}
	out := make([]TokenLogprob, int(n))
	for i := range out {
		top := make([]Alternative, k)
		for j := range top {
			top[j] = Alternative{Token: altTokens[i*k+j], Logprob: altLogprobs[i*k+j]}
		}
		out[i] = TokenLogprob{Token: tokens[i], Logprob: logprobs[i], Top: top}
	}
	return out
}

// StepText is the text of the last Step's (or StepMany's) tokens: whole UTF-8 characters, nothing
// of end-of-generation tokens or of what may begin a stop string.
func (s *Session) StepText() (string, error) {
	return s.text(func(p *C.specinfer_session, t **C.char, n *C.size_t) C.specinfer_status {
		return C.specinfer_session_step_text(p, t, n)
	})
}

// EndText ends the text where the caller ends it (its own token budget): it returns the tail held
// back because it could begin a stop string ("" when none).
func (s *Session) EndText() (string, error) {
	return s.text(func(p *C.specinfer_session, t **C.char, n *C.size_t) C.specinfer_status {
		return C.specinfer_session_end_text(p, t, n)
	})
}

// text copies out the session-owned text that call points to.
func (s *Session) text(call func(*C.specinfer_session, **C.char, *C.size_t) C.specinfer_status) (string, error) {
	p, err := s.raw()
	if err != nil {
		return "", err
	}
	defer runtime.KeepAlive(s)
	var text *C.char
	var n C.size_t
	if err := s.check(call(p, &text, &n)); err != nil {
		return "", err
	}
	return C.GoStringN(text, C.int(n)), nil
}

// StepResult is one session's part of StepMany.
type StepResult struct {
	// Tokens the round emitted: 1 to MaxDraft+1, or none while the session's prompt is still
	// scored in chunks (StepParams.PrefillChunk).
	Tokens []int32
	// Done is true when the text ended: an end-of-generation token or a stop string.
	Done bool
	// Text is the tokens' text: whole UTF-8 characters (one split between rounds comes whole with
	// the later round), nothing for end-of-generation tokens nor for what may begin a stop string
	// (SetStopStrings).
	Text string
	// Err is this session's error (nil when its round succeeded); it did not stop the others.
	Err error
}

// StepParams are how StepManyWith runs; DefaultStepParams gives the library's defaults.
type StepParams struct {
	// PrefillChunk: a session whose prompt is not scored yet scores at most this many of its
	// tokens per call (emitting none in that call), so a long prompt delays the other sessions'
	// tokens by a little per call instead of a whole prefill. 0: the whole prompt at once.
	PrefillChunk int
}

// DefaultStepParams returns the library's defaults.
func DefaultStepParams() StepParams {
	var p C.specinfer_step_params
	C.specinfer_step_params_init(&p)
	return StepParams{PrefillChunk: int(p.prefill_chunk)}
}

// StepMany runs one round of each session, as Step would, with one target pass for all sessions
// whose targets share a loaded model (Target.Share, or targets opened with the same plugin and
// config): the weights are read once for all of them, and each session emits exactly what its
// own Step would. Continuous batching is a loop over StepMany with the sessions still
// generating; sessions may join and leave between calls. The caller holds every session for the
// call (no other goroutine uses them meanwhile).
//
// A call refused as a whole (a session twice, a nil or closed session) runs nothing and returns
// (nil, err). Otherwise there is one result per session, in order, and err is the first failing
// session's error (nil when every round succeeded).
func StepMany(sessions []*Session) ([]StepResult, error) {
	return StepManyWith(sessions, DefaultStepParams())
}

// StepManyWith is StepMany with StepParams.
func StepManyWith(sessions []*Session, params StepParams) ([]StepResult, error) {
	n := len(sessions)
	if n == 0 {
		return nil, nil
	}
	defer runtime.KeepAlive(sessions)
	ptrs := make([]*C.specinfer_session, n)
	total := 0
	for i, s := range sessions {
		p, err := s.raw()
		if err != nil {
			return nil, &Error{Code: InvalidArgument, Message: fmt.Sprintf("session %d: %s", i, err.(*Error).Message)}
		}
		ptrs[i] = p
		total += s.maxEmit
	}
	// The results point at the token buffers, so both live in C memory (cgo passes no Go memory
	// holding Go pointers).
	var r C.specinfer_step_result
	rp := (*C.specinfer_step_result)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(r))))
	tp := (*C.int32_t)(C.calloc(C.size_t(total), 4))
	defer C.free(unsafe.Pointer(rp))
	defer C.free(unsafe.Pointer(tp))
	if rp == nil || tp == nil {
		return nil, &Error{Code: OutOfMemory, Message: "step_many: no memory for the results"}
	}
	results, tokens := unsafe.Slice(rp, n), unsafe.Slice(tp, total)
	unset := ^C.specinfer_status(0) // a status the library never writes: still there, it did not run
	off := 0
	for i, s := range sessions {
		results[i].struct_size = C.uint32_t(unsafe.Sizeof(r))
		results[i].tokens = &tokens[off]
		results[i].cap = C.size_t(s.maxEmit)
		results[i].status = unset
		off += s.maxEmit
	}
	var p C.specinfer_step_params
	C.specinfer_step_params_init(&p)
	p.prefill_chunk = C.int32_t(params.PrefillChunk)
	st := C.specinfer_session_step_many(&ptrs[0], &results[0], C.size_t(n), &p)
	ran := false
	for i := range results {
		ran = ran || results[i].status != unset
	}
	if !ran && st != C.SPECINFER_OK {
		msg := "step_many refused the call (nothing ran)"
		for i := range ptrs { // the library names a session given twice on that session
			for j := 0; j < i; j++ {
				if ptrs[i] == ptrs[j] {
					msg = fmt.Sprintf("sessions %d and %d: %s", j, i, C.GoString(C.specinfer_session_errmsg(ptrs[i])))
				}
			}
		}
		return nil, &Error{Code: Code(st), Message: msg}
	}
	out := make([]StepResult, n)
	var first error
	for i := range results {
		res := &results[i]
		if err := sessions[i].check(res.status); err != nil {
			out[i].Err = err
			if first == nil {
				first = err
			}
			continue
		}
		out[i].Tokens = make([]int32, int(res.n_tokens))
		copy(out[i].Tokens, unsafe.Slice((*int32)(unsafe.Pointer(res.tokens)), int(res.n_tokens)))
		out[i].Done = res.done != 0
		text, err := sessions[i].StepText()
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Text = text
	}
	return out, first
}

// Stats returns the session's counters and timings.
func (s *Session) Stats() (Stats, error) {
	p, err := s.raw()
	if err != nil {
		return Stats{}, err
	}
	defer runtime.KeepAlive(s)
	var st C.specinfer_session_stats
	C.specinfer_session_stats_init(&st)
	if err := s.check(C.specinfer_session_get_stats(p, &st)); err != nil {
		return Stats{}, err
	}
	return Stats{
		NPromptTokens: int64(st.n_prompt_tokens), NGenerated: int64(st.n_generated), NRounds: int64(st.n_rounds),
		NTargetPasses: int64(st.n_target_passes), NDrafted: int64(st.n_drafted), NAccepted: int64(st.n_accepted),
		AcceptanceRate: float64(st.acceptance_rate), MeanAccepted: float64(st.mean_accepted),
		TPrefillMs: float64(st.t_prefill_ms), TDraftMs: float64(st.t_draft_ms), TVerifyMs: float64(st.t_verify_ms),
		TSampleMs: float64(st.t_sample_ms), TTotalMs: float64(st.t_total_ms), TokensPerSecond: float64(st.tokens_per_second),
		NContextShifts: int64(st.n_context_shifts), NForcedDrafted: int64(st.n_forced_drafted),
		NForcedAccepted: int64(st.n_forced_accepted), TConstraintMs: float64(st.t_constraint_ms),
		NCachedTokens:    int64(st.n_cached_tokens),
		NEstimatedRounds: int64(st.n_estimated_rounds), ExpectedAccepted: float64(st.expected_accepted),
		EstimatedRoundsAccepted: float64(st.estimated_rounds_accepted),
	}, nil
}

// Reset forgets the text and the statistics.
func (s *Session) Reset() error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	return s.check(C.specinfer_session_reset(p))
}

// Tokens returns the whole token sequence, prompt and generated.
func (s *Session) Tokens() ([]int32, error) {
	p, err := s.raw()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(s)
	var tp *C.int32_t
	var n C.size_t
	if err := s.check(C.specinfer_session_tokens(p, &tp, &n)); err != nil {
		return nil, err
	}
	out := make([]int32, int(n))
	if n > 0 {
		copy(out, unsafe.Slice((*int32)(unsafe.Pointer(tp)), int(n)))
	}
	return out, nil
}

func (s Stats) String() string {
	return fmt.Sprintf("%d tokens in %d rounds, acceptance %.2f, %.2f tokens per target pass",
		s.NGenerated, s.NRounds, s.AcceptanceRate, s.MeanAccepted)
}
