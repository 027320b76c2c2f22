// Package specinfer binds the specinfer C library: speculative decoding of language models on
// the CPU. A Registry opens Targets (models), Drafters (cheap proposers) and Constraints
// (grammars the text must match); a Session generates text with a target, an optional drafter,
// an optional Coupler and an optional constraint.
//
// Every handle has a Close method and a finalizer, so a forgotten Close frees the C object
// when the garbage collector finds the handle unreachable. Handles keep what they depend on
// reachable (a Target its Registry, a DrafterHandle and a Constraint their Target, a Session its
// Target, DrafterHandle, Coupler and Constraint), so the C library's order of destruction holds.
// Errors are *Error values carrying the library's status code and message.
//
// Threads: a Registry, a Coupler and a Sketcher may be used from many goroutines; a Target, a
// DrafterHandle, a Constraint and a Session from one goroutine at a time.
//
// One model, many users: Target.Share opens another target on a target's loaded model (weights
// shared, a KV cache of its own); give each goroutine its own share and its sessions run at the
// same time as the others'. StepMany runs one round of several sessions with one target pass
// for those whose targets share a model (continuous batching is a loop over it).
package specinfer

/*
#cgo pkg-config: specinfer
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Code is a specinfer status code.
type Code int

const (
	OK              Code = C.SPECINFER_OK
	InvalidArgument Code = C.SPECINFER_ERR_INVALID_ARGUMENT
	OutOfMemory     Code = C.SPECINFER_ERR_OUT_OF_MEMORY
	NotFound        Code = C.SPECINFER_ERR_NOT_FOUND
	IOError         Code = C.SPECINFER_ERR_IO
	FormatError     Code = C.SPECINFER_ERR_FORMAT
	ABIMismatch     Code = C.SPECINFER_ERR_ABI_MISMATCH
	Unsupported     Code = C.SPECINFER_ERR_UNSUPPORTED
	ConfigError     Code = C.SPECINFER_ERR_CONFIG
	StateError      Code = C.SPECINFER_ERR_STATE
	Cancelled       Code = C.SPECINFER_ERR_CANCELLED
	PluginError     Code = C.SPECINFER_ERR_PLUGIN
	ContextFull     Code = C.SPECINFER_ERR_CONTEXT_FULL
	BufferTooSmall  Code = C.SPECINFER_ERR_BUFFER_TOO_SMALL
	InternalError   Code = C.SPECINFER_ERR_INTERNAL
)

// String is the library's name of the code, e.g. "SPECINFER_ERR_CONFIG".
func (c Code) String() string { return C.GoString(C.specinfer_status_str(C.int(c))) }

// Error is a failure reported by specinfer.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return e.Code.String() + ": " + e.Message }

// Is makes errors.Is(err, &Error{Code: c}) match any error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// NewError makes an error with a code, for a Go drafter to return.
func NewError(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// checkMsg turns a status and an errmsg the library allocated into an error (and frees it).
func checkMsg(st C.specinfer_status, msg *C.char) error {
	defer C.specinfer_free(unsafe.Pointer(msg))
	if st == C.SPECINFER_OK {
		return nil
	}
	m := ""
	if msg != nil {
		m = C.GoString(msg)
	}
	return &Error{Code: Code(st), Message: m}
}

// checkWith turns a status into an error whose message is a handle's last error.
func checkWith(st C.specinfer_status, msg *C.char) error {
	if st == C.SPECINFER_OK {
		return nil
	}
	m := ""
	if msg != nil {
		m = C.GoString(msg)
	}
	if m == "" {
		m = Code(st).String()
	}
	return &Error{Code: Code(st), Message: m}
}

var live atomic.Int64

// LiveHandles is the number of C objects (registries, targets, drafters, constraints, couplers,
// sessions, sketchers, and instances of Go drafters) made through this package and not yet freed.
func LiveHandles() int { return int(live.Load()) }

// Version is the version of the loaded library, e.g. "0.1.0".
func Version() string { return C.GoString(C.specinfer_version_string()) }

// ---------------------------------------------------------------------------------------------
// Registry

// Registry is the set of loaded plugins and the backend's thread pool.
type Registry struct {
	mu    sync.Mutex
	ptr   *C.specinfer_registry
	slots map[string]int // in-process Go drafters registered here
}

// NewRegistry makes a registry whose backend uses nThreads threads (0: SPECINFER_THREADS from
// the environment, else all cores).
func NewRegistry(nThreads int) (*Registry, error) {
	var p C.specinfer_registry_params
	C.specinfer_registry_params_init(&p)
	p.n_threads = C.int32_t(nThreads)
	var out *C.specinfer_registry
	var msg *C.char
	if err := checkMsg(C.specinfer_registry_create(&p, &out, &msg), msg); err != nil {
		return nil, err
	}
	live.Add(1)
	r := &Registry{ptr: out, slots: map[string]int{}}
	runtime.SetFinalizer(r, func(r *Registry) { r.Close() })
	return r, nil
}

// Close destroys the registry. It fails with StateError while targets or drafters opened
// through it are open. Closing twice is a no-op.
func (r *Registry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr == nil {
		return nil
	}
	if st := C.specinfer_registry_destroy(r.ptr); st != C.SPECINFER_OK {
		return &Error{Code: Code(st), Message: "registry still has open targets or drafters"}
	}
	r.ptr = nil
	live.Add(-1)
	for _, slot := range r.slots {
		releaseSlot(slot)
	}
	r.slots = nil
	runtime.SetFinalizer(r, nil)
	return nil
}

func (r *Registry) raw() (*C.specinfer_registry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr == nil {
		return nil, &Error{Code: InvalidArgument, Message: "the registry is closed"}
	}
	return r.ptr, nil
}

// Threads is the number of backend threads in use.
func (r *Registry) Threads() int {
	p, err := r.raw()
	if err != nil {
		return 0
	}
	defer runtime.KeepAlive(r)
	return int(C.specinfer_registry_threads(p))
}

// PluginInfo is what the registry says of one loaded plugin.
type PluginInfo struct {
	Name, Version, Description, Path string
	HasTarget, HasDrafter            bool
	HasConstraint                    bool // provides constraints (Registry.OpenConstraint)
	ABIVersion                       uint32
}

// Plugins lists the loaded plugins.
func (r *Registry) Plugins() ([]PluginInfo, error) {
	p, err := r.raw()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(r)
	n := int(C.specinfer_registry_plugin_count(p))
	out := make([]PluginInfo, 0, n)
	for i := 0; i < n; i++ {
		var info C.specinfer_plugin_info
		info.struct_size = C.uint32_t(unsafe.Sizeof(info))
		if err := checkWith(C.specinfer_registry_plugin_info(p, C.int32_t(i), &info), nil); err != nil {
			return nil, err
		}
		out = append(out, PluginInfo{
			Name: C.GoString(info.name), Version: C.GoString(info.version),
			Description: C.GoString(info.description), Path: C.GoString(info.path),
			HasTarget: info.has_target != 0, HasDrafter: info.has_drafter != 0,
			HasConstraint: info.has_constraint != 0, ABIVersion: uint32(info.abi_version),
		})
	}
	return out, nil
}

// LoadPlugin loads one plugin file.
func (r *Registry) LoadPlugin(path string) error {
	p, err := r.raw()
	if err != nil {
		return err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg *C.char
	err = checkMsg(C.specinfer_registry_load_plugin(p, cpath, &msg), msg)
	runtime.KeepAlive(r)
	return err
}

// UnloadPlugin unloads a plugin by name (a Go drafter too).
func (r *Registry) UnloadPlugin(name string) error {
	p, err := r.raw()
	if err != nil {
		return err
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var msg *C.char
	if err := checkMsg(C.specinfer_registry_unload_plugin(p, cname, &msg), msg); err != nil {
		return err
	}
	runtime.KeepAlive(r)
	r.mu.Lock()
	defer r.mu.Unlock()
	if slot, ok := r.slots[name]; ok {
		releaseSlot(slot)
		delete(r.slots, name)
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// Targets

// ModelInfo is what a target says of its model.
type ModelInfo struct {
	VocabSize, NCtx, HiddenSize int
	BOS, EOS, EOT               int // -1 when none
	AddBOS                      bool
	Name, Arch                  string
	ChatTemplate                string // the model's Jinja chat template, "" when it has none
}

func modelInfo(i *C.specinfer_model_info) ModelInfo {
	return ModelInfo{
		VocabSize: int(i.vocab_size), NCtx: int(i.n_ctx), HiddenSize: int(i.hidden_size),
		BOS: int(i.bos_token), EOS: int(i.eos_token), EOT: int(i.eot_token), AddBOS: i.add_bos != 0,
		Name: C.GoString(i.name), Arch: C.GoString(i.arch), ChatTemplate: C.GoString(i.chat_template),
	}
}

// Target is a model whose text we want: a loaded model (weights, shared with the targets made by
// Share) and a KV cache of its own. Used by one goroutine at a time; targets sharing a model are
// used by different goroutines at once and closed in any order.
type Target struct {
	ptr      *C.specinfer_target
	registry *Registry
}

// OpenTarget opens a target ("kgram", "gguf", ...) with a key=value,... config.
func (r *Registry) OpenTarget(plugin, config string) (*Target, error) {
	p, err := r.raw()
	if err != nil {
		return nil, err
	}
	cp, cc := C.CString(plugin), C.CString(config)
	defer C.free(unsafe.Pointer(cp))
	defer C.free(unsafe.Pointer(cc))
	var out *C.specinfer_target
	var msg *C.char
	if err := checkMsg(C.specinfer_target_open(p, cp, cc, &out, &msg), msg); err != nil {
		return nil, err
	}
	live.Add(1)
	t := &Target{ptr: out, registry: r}
	runtime.SetFinalizer(t, func(t *Target) { t.Close() })
	return t, nil
}

// Share opens another target on the model t has loaded: the weights and tokenizer are shared,
// not loaded again, and the new target has an empty KV cache of its own. Each share is used by
// its own goroutine (one at a time, as any target) while the others run; the model stays loaded
// until the last target on it is closed, in any order. Share may be called while a session on t
// runs in another goroutine. The way to serve many users from one copy of the weights: one
// share per session. Unsupported when the plugin cannot share (open the target again instead).
func (t *Target) Share() (*Target, error) {
	p, err := t.raw()
	if err != nil {
		return nil, err
	}
	var out *C.specinfer_target
	var msg *C.char
	err = checkMsg(C.specinfer_target_share(p, &out, &msg), msg)
	runtime.KeepAlive(t)
	if err != nil {
		return nil, err
	}
	live.Add(1)
	s := &Target{ptr: out, registry: t.registry}
	runtime.SetFinalizer(s, func(t *Target) { t.Close() })
	return s, nil
}

// Close closes the target; it fails with StateError while a session or drafter uses it.
func (t *Target) Close() error {
	if t.ptr == nil {
		return nil
	}
	if st := C.specinfer_target_destroy(t.ptr); st != C.SPECINFER_OK {
		return &Error{Code: Code(st), Message: "the target is still used by a session or drafter"}
	}
	t.ptr = nil
	live.Add(-1)
	runtime.SetFinalizer(t, nil)
	return nil
}

func (t *Target) raw() (*C.specinfer_target, error) {
	if t == nil || t.ptr == nil {
		return nil, &Error{Code: InvalidArgument, Message: "the target is closed"}
	}
	return t.ptr, nil
}

// Info describes the target's model.
func (t *Target) Info() (ModelInfo, error) {
	p, err := t.raw()
	if err != nil {
		return ModelInfo{}, err
	}
	defer runtime.KeepAlive(t)
	var i C.specinfer_model_info
	C.specinfer_model_info_init(&i)
	if err := checkWith(C.specinfer_target_info(p, &i), C.specinfer_target_errmsg(p)); err != nil {
		return ModelInfo{}, err
	}
	return modelInfo(&i), nil
}

// EndOfGeneration returns every token that ends generation (EOS and EOT among them), in
// increasing order. (Not in ModelInfo, which stays comparable with ==.)
func (t *Target) EndOfGeneration() ([]int32, error) {
	p, err := t.raw()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(t)
	var i C.specinfer_model_info
	C.specinfer_model_info_init(&i)
	if err := checkWith(C.specinfer_target_info(p, &i), C.specinfer_target_errmsg(p)); err != nil {
		return nil, err
	}
	if i.eog_tokens == nil || i.n_eog_tokens <= 0 {
		return nil, nil
	}
	return slices.Clone(unsafe.Slice((*int32)(unsafe.Pointer(i.eog_tokens)), int(i.n_eog_tokens))), nil
}

// Tokenize turns text into token ids.
func (t *Target) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	p, err := t.raw()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(t)
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	buf := make([]int32, len(text)+8)
	for {
		var n C.size_t
		st := C.specinfer_target_tokenize(p, ct, C.size_t(len(text)), cbool(addSpecial), cbool(parseSpecial),
			(*C.int32_t)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		if st == C.SPECINFER_ERR_BUFFER_TOO_SMALL && int(n) > len(buf) {
			buf = make([]int32, int(n))
			continue
		}
		if err := checkWith(st, C.specinfer_target_errmsg(p)); err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// Detokenize turns token ids into the bytes of their text.
func (t *Target) Detokenize(tokens []int32) ([]byte, error) {
	p, err := t.raw()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(t)
	buf := make([]byte, 4*len(tokens)+16)
	for {
		var n C.size_t
		st := C.specinfer_target_detokenize(p, int32Ptr(tokens), C.size_t(len(tokens)),
			(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		if st == C.SPECINFER_ERR_BUFFER_TOO_SMALL && int(n) > len(buf) {
			buf = make([]byte, int(n))
			continue
		}
		if err := checkWith(st, C.specinfer_target_errmsg(p)); err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

func int32Ptr(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

// ---------------------------------------------------------------------------------------------
// Drafters

// DrafterHandle is a cheap proposer opened from a plugin or from a Go drafter registered with
// RegisterDrafter.
type DrafterHandle struct {
	ptr    *C.specinfer_drafter
	target *Target
}

// OpenDrafter opens a drafter ("ngram", "kgram", a Go one, ...) for target.
func (r *Registry) OpenDrafter(plugin, config string, target *Target) (*DrafterHandle, error) {
	p, err := r.raw()
	if err != nil {
		return nil, err
	}
	tp, err := target.raw()
	if err != nil {
		return nil, err
	}
	cp, cc := C.CString(plugin), C.CString(config)
	defer C.free(unsafe.Pointer(cp))
	defer C.free(unsafe.Pointer(cc))
	var out *C.specinfer_drafter
	var msg *C.char
	if err := checkMsg(C.specinfer_drafter_open(p, cp, cc, tp, &out, &msg), msg); err != nil {
		return nil, err
	}
	runtime.KeepAlive(r)
	live.Add(1)
	d := &DrafterHandle{ptr: out, target: target}
	runtime.SetFinalizer(d, func(d *DrafterHandle) { d.Close() })
	return d, nil
}

// Close closes the drafter; it fails with StateError while a session uses it.
func (d *DrafterHandle) Close() error {
	if d.ptr == nil {
		return nil
	}
	if st := C.specinfer_drafter_destroy(d.ptr); st != C.SPECINFER_OK {
		return &Error{Code: Code(st), Message: "the drafter is still used by a session"}
	}
	d.ptr = nil
	live.Add(-1)
	runtime.SetFinalizer(d, nil)
	return nil
}

// ---------------------------------------------------------------------------------------------
// Couplers

// Coupler decides which drafted tokens the target keeps ("greedy", "rejection", "gumbel", ...).
type Coupler struct {
	ptr *C.specinfer_coupler
}

// NewCoupler makes a coupler from a spec string.
func NewCoupler(spec string) (*Coupler, error) {
	cs := C.CString(spec)
	defer C.free(unsafe.Pointer(cs))
	var out *C.specinfer_coupler
	var msg *C.char
	if err := checkMsg(C.specinfer_coupler_create(cs, &out, &msg), msg); err != nil {
		return nil, err
	}
	live.Add(1)
	c := &Coupler{ptr: out}
	runtime.SetFinalizer(c, func(c *Coupler) { c.Close() })
	return c, nil
}

// Close frees the coupler. Sessions using it must be closed first.
func (c *Coupler) Close() error {
	if c.ptr == nil {
		return nil
	}
	C.specinfer_coupler_destroy(c.ptr)
	c.ptr = nil
	live.Add(-1)
	runtime.SetFinalizer(c, nil)
	return nil
}

// Name is the canonical spec, e.g. "lenient:0.5".
func (c *Coupler) Name() string {
	defer runtime.KeepAlive(c)
	return C.GoString(C.specinfer_coupler_name(c.ptr))
}

// IsExact reports whether the emitted text is distributed exactly as the target's.
func (c *Coupler) IsExact() bool {
	defer runtime.KeepAlive(c)
	return C.specinfer_coupler_is_exact(c.ptr) != 0
}

// Verify checks a chain draft of k tokens: p holds k+1 rows of vocab probabilities, q k rows
// (nil for point masses). It returns the accepted prefix length and the next token.
func (c *Coupler) Verify(vocab int, p, q []float32, draft []int32, seed uint64, position int64) (int, int32, error) {
	if c.ptr == nil {
		return 0, 0, &Error{Code: InvalidArgument, Message: "the coupler is closed"}
	}
	defer runtime.KeepAlive(c)
	var nAcc, tok C.int32_t
	var msg *C.char
	var pp, qp *C.float
	if len(p) > 0 {
		pp = (*C.float)(unsafe.Pointer(&p[0]))
	}
	if len(q) > 0 {
		qp = (*C.float)(unsafe.Pointer(&q[0]))
	}
	st := C.specinfer_coupler_verify(c.ptr, C.int32_t(vocab), C.int32_t(len(draft)), pp, C.size_t(len(p)), qp,
		C.size_t(len(q)), int32Ptr(draft), C.uint64_t(seed), C.int64_t(position), &nAcc, &tok, &msg)
	if err := checkMsg(st, msg); err != nil {
		return 0, 0, err
	}
	return int(nAcc), int32(tok), nil
}
