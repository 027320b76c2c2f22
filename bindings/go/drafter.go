package specinfer

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Drafter is a drafter written in Go: it proposes tokens that the target then verifies.
// One value serves one session; the library calls it from one goroutine at a time.
type Drafter interface {
	// Begin starts a new sequence with context (the prompt).
	Begin(context []int32) error
	// Propose proposes a chain of up to req.MaxTokens tokens continuing req.Context.
	Propose(req *DraftRequest) (Draft, error)
	// Commit appends tokens to the sequence (the accepted draft and the corrected token).
	Commit(tokens []int32) error
}

// DrafterFactory makes a Drafter from a key=value,... config and the target's model info.
type DrafterFactory func(config string, target ModelInfo) (Drafter, error)

// Draft is a proposal: Tokens, and optionally Probs, the len(Tokens) x vocab distributions the
// tokens were drawn from (nil: point masses, for deterministic drafters), and ExpectedAccepted,
// how many of the tokens the drafter expects the target to keep (0..len(Tokens); nil: no
// estimate), which Stats shows beside what was kept.
type Draft struct {
	Tokens           []int32
	Probs            []float32
	ExpectedAccepted *float64
}

// DraftRequest is what the session asks of a drafter. Its slices point into the library's
// memory and are valid during the call only.
type DraftRequest struct {
	MaxTokens   int
	Context     []int32 // the whole committed sequence
	Temperature float32
	Seed        uint64
	// Hidden is the target's last hidden state (the input of its output layer,
	// ModelInfo.HiddenSize floats) at sequence index HiddenPosition, the position whose logits
	// chose the last committed token; nil when the session has none (a target without hidden
	// states, such as kgram, or a library older than this field).
	Hidden         []float32
	HiddenPosition int64 // len(Context) - 2; -1 when Hidden is nil
	// PassCost[i] is the time of one target pass over i + 1 tokens (the last committed token and
	// i drafted ones) relative to a one-token pass, as the session measured it on this machine:
	// MaxTokens + 1 entries, the first 1. A drafter that sizes its own draft weighs what a token
	// is expected to add against this cost. Nil with a library older than this field.
	PassCost []float32
	raw      *C.specinfer_draft_request
}

// Where the fields that the request grew after sample_ctx end: a library older than them hands
// a smaller struct_size, and they are not read.
const (
	hiddenEnd   = unsafe.Offsetof(C.specinfer_draft_request{}.hidden_position) + unsafe.Sizeof(C.int64_t(0))
	passCostEnd = unsafe.Offsetof(C.specinfer_draft_request{}.n_pass_cost) + unsafe.Sizeof(C.int32_t(0))
)

func newDraftRequest(req *C.specinfer_draft_request) *DraftRequest {
	r := &DraftRequest{
		MaxTokens: int(req.max_tokens), Context: int32s(req.context, req.n_context),
		Temperature: float32(req.temperature), Seed: uint64(req.seed), HiddenPosition: -1, raw: req,
	}
	size := uintptr(req.struct_size)
	if size >= hiddenEnd && req.hidden != nil && req.hidden_size > 0 {
		r.Hidden = unsafe.Slice((*float32)(unsafe.Pointer(req.hidden)), int(req.hidden_size))
		r.HiddenPosition = int64(req.hidden_position)
	}
	if size >= passCostEnd && req.pass_cost != nil && req.n_pass_cost > 0 {
		r.PassCost = unsafe.Slice((*float32)(unsafe.Pointer(req.pass_cost)), int(req.n_pass_cost))
	}
	return r
}

// Sample draws a token from q the way the session's coupler wants the draft side sampled, for
// the token at sequence index position (-1 when the session gave no sampler).
func (r *DraftRequest) Sample(q []float32, position int64) int32 {
	if len(q) == 0 {
		return -1
	}
	return int32(C.si_go_sample(r.raw, (*C.float)(unsafe.Pointer(&q[0])), C.int32_t(len(q)), C.int64_t(position)))
}

// MaxInProcess is how many Go drafters may be registered at once in a process.
const MaxInProcess = C.SI_GO_SLOTS

type slot struct {
	factory    DrafterFactory
	descriptor *C.specinfer_plugin_descriptor
}

var (
	slotsMu sync.Mutex
	slots   [MaxInProcess]*slot
)

func releaseSlot(i int) {
	slotsMu.Lock()
	defer slotsMu.Unlock()
	if s := slots[i]; s != nil {
		C.si_go_free_descriptor(s.descriptor)
		slots[i] = nil
	}
}

// RegisterDrafter registers a drafter written in Go under name; OpenDrafter(name, config, t)
// then calls factory for each instance. (The C plugin ABI passes no user pointer to a factory,
// so each registration takes one of MaxInProcess slots with its own C entry points.)
func (r *Registry) RegisterDrafter(name, description string, factory DrafterFactory) error {
	p, err := r.raw()
	if err != nil {
		return err
	}
	if factory == nil {
		return &Error{Code: InvalidArgument, Message: "factory is nil"}
	}
	cn, cv, cd := C.CString(name), C.CString(Version()), C.CString(description)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cv))
	defer C.free(unsafe.Pointer(cd))
	slotsMu.Lock()
	idx := -1
	for i, s := range slots {
		if s == nil {
			idx = i
			break
		}
	}
	if idx < 0 {
		slotsMu.Unlock()
		return NewError(StateError, "at most %d Go drafters may be registered at once", MaxInProcess)
	}
	d := C.si_go_descriptor(C.int(idx), cn, cv, cd)
	if d == nil {
		slotsMu.Unlock()
		return &Error{Code: OutOfMemory, Message: "cannot allocate a plugin descriptor"}
	}
	slots[idx] = &slot{factory: factory, descriptor: d}
	slotsMu.Unlock()

	var msg *C.char
	if err := checkMsg(C.specinfer_registry_register_plugin(p, d, &msg), msg); err != nil {
		releaseSlot(idx)
		return err
	}
	r.mu.Lock()
	r.slots[name] = idx
	r.mu.Unlock()
	return nil
}

func setErr(err *C.specinfer_plugin_error, msg string) {
	cm := C.CString(msg)
	C.si_go_set_error(err, cm)
	C.free(unsafe.Pointer(cm))
}

// status turns an error from Go code into a status and a message.
func status(e error, cerr *C.specinfer_plugin_error) C.int {
	if e == nil {
		return C.SPECINFER_OK
	}
	var se *Error
	if errors.As(e, &se) && se.Code != OK {
		setErr(cerr, se.Message)
		return C.int(se.Code)
	}
	setErr(cerr, e.Error())
	return C.SPECINFER_ERR_PLUGIN
}

// guard runs Go drafter code, turning a panic into an error.
func guard(cerr *C.specinfer_plugin_error, f func() error) (st C.int) {
	defer func() {
		if r := recover(); r != nil {
			setErr(cerr, fmt.Sprintf("the Go drafter panicked: %v", r))
			st = C.SPECINFER_ERR_PLUGIN
		}
	}()
	return status(f(), cerr)
}

func int32s(p *C.int32_t, n C.size_t) []int32 {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(p)), int(n))
}

//export goSpecinferDrafterCreate
func goSpecinferDrafterCreate(slotIdx C.int, config *C.char, info *C.specinfer_model_info, handle *C.uintptr_t,
	cerr *C.specinfer_plugin_error) C.int {
	slotsMu.Lock()
	s := slots[int(slotIdx)]
	slotsMu.Unlock()
	if s == nil {
		setErr(cerr, "this Go drafter was unregistered")
		return C.SPECINFER_ERR_STATE
	}
	cfg := ""
	if config != nil {
		cfg = C.GoString(config)
	}
	mi := modelInfo(info)
	return guard(cerr, func() error {
		src, err := s.factory(cfg, mi)
		if err != nil {
			return err
		}
		if src == nil {
			return NewError(PluginError, "the drafter factory returned nil")
		}
		*handle = C.uintptr_t(cgo.NewHandle(src))
		live.Add(1)
		return nil
	})
}

//export goSpecinferDrafterDestroy
func goSpecinferDrafterDestroy(h C.uintptr_t) {
	cgo.Handle(h).Delete()
	live.Add(-1)
}

//export goSpecinferDrafterBegin
func goSpecinferDrafterBegin(h C.uintptr_t, context *C.int32_t, n C.size_t, cerr *C.specinfer_plugin_error) C.int {
	src := cgo.Handle(h).Value().(Drafter)
	return guard(cerr, func() error { return src.Begin(int32s(context, n)) })
}

//export goSpecinferDrafterCommit
func goSpecinferDrafterCommit(h C.uintptr_t, tokens *C.int32_t, n C.size_t, cerr *C.specinfer_plugin_error) C.int {
	src := cgo.Handle(h).Value().(Drafter)
	return guard(cerr, func() error { return src.Commit(int32s(tokens, n)) })
}

//export goSpecinferDrafterPropose
func goSpecinferDrafterPropose(h C.uintptr_t, req *C.specinfer_draft_request, out *C.specinfer_draft,
	cerr *C.specinfer_plugin_error) C.int {
	src := cgo.Handle(h).Value().(Drafter)
	out.n_nodes = 0
	out.has_probs = 0
	r := newDraftRequest(req)
	return guard(cerr, func() error {
		d, err := src.Propose(r)
		if err != nil {
			return err
		}
		n, cp, vocab := len(d.Tokens), int(out.cap), int(out.vocab_size)
		if n > cp {
			return NewError(InvalidArgument, "the draft has %d tokens, room for %d", n, cp)
		}
		if d.Probs != nil && len(d.Probs) != n*vocab {
			return NewError(InvalidArgument, "the draft has %d probabilities, want %d x %d", len(d.Probs), n, vocab)
		}
		if e := d.ExpectedAccepted; e != nil && !(*e >= 0 && *e <= float64(n)) { // NaN included
			return NewError(InvalidArgument, "the draft expects %g accepted tokens, not within 0..%d (its length)", *e, n)
		}
		if n == 0 {
			return nil
		}
		toks := unsafe.Slice((*int32)(unsafe.Pointer(out.tokens)), cp)
		parents := unsafe.Slice((*int32)(unsafe.Pointer(out.parents)), cp)
		for i, t := range d.Tokens {
			if t < 0 || int(t) >= vocab {
				return NewError(InvalidArgument, "token %d is outside the vocabulary", t)
			}
			toks[i] = t
			parents[i] = int32(i - 1)
		}
		if d.Probs != nil {
			copy(unsafe.Slice((*float32)(unsafe.Pointer(out.probs)), cp*vocab), d.Probs)
			out.has_probs = 1
		}
		out.n_nodes = C.int32_t(n)
		// A host whose draft has the field (struct_size covers it) shows the estimate.
		if e := d.ExpectedAccepted; e != nil &&
			uintptr(out.struct_size) >= unsafe.Offsetof(out.expected_accepted)+unsafe.Sizeof(out.expected_accepted) {
			out.expected_accepted = C.double(*e)
		}
		return nil
	})
}
