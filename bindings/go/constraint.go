package specinfer

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Constraint is what the text a session generates must match (Session.SetConstraint): a grammar
// compiled by a constraint plugin for the vocabulary of one target. It keeps that target
// reachable, and a session it is set on keeps the constraint reachable. One session uses it at a
// time (Fork makes another for a second session without compiling the grammar again), and it is
// used from that session's goroutine.
type Constraint struct {
	ptr    *C.specinfer_constraint
	target *Target
}

// OpenConstraint compiles grammar, of kind, with the constraint plugin plugin (loaded from the
// plugin path like targets) and a key=value,... config, for target's vocabulary. The plugin
// "llguidance" knows the kinds "json_schema" (a JSON Schema), "json_object" (any JSON object;
// grammar ignored), "regex" (a regular expression the whole text matches) and "lark" (a
// context-free grammar in Lark syntax). The constraint serves sessions on target or on a target
// sharing its model.
//
// Errors: NotFound (no such plugin, or it provides no constraints), InvalidArgument (a grammar
// that does not compile: the message says why), Unsupported (a kind the plugin does not know),
// ConfigError, PluginError.
func (r *Registry) OpenConstraint(plugin, config string, target *Target, kind, grammar string) (*Constraint, error) {
	p, err := r.raw()
	if err != nil {
		return nil, err
	}
	tp, err := target.raw()
	if err != nil {
		return nil, err
	}
	cp, cc, ck, cg := C.CString(plugin), C.CString(config), C.CString(kind), C.CString(grammar)
	defer C.free(unsafe.Pointer(cp))
	defer C.free(unsafe.Pointer(cc))
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cg))
	var out *C.specinfer_constraint
	var msg *C.char
	err = checkMsg(C.specinfer_constraint_open(p, cp, cc, tp, ck, cg, &out, &msg), msg)
	runtime.KeepAlive(r)
	runtime.KeepAlive(target)
	if err != nil {
		return nil, err
	}
	return newConstraint(out, target), nil
}

func newConstraint(ptr *C.specinfer_constraint, target *Target) *Constraint {
	live.Add(1)
	c := &Constraint{ptr: ptr, target: target}
	runtime.SetFinalizer(c, func(c *Constraint) { c.Close() })
	return c
}

func (c *Constraint) raw() (*C.specinfer_constraint, error) {
	if c == nil || c.ptr == nil {
		return nil, &Error{Code: InvalidArgument, Message: "the constraint is closed"}
	}
	return c.ptr, nil
}

// Fork returns a new constraint in c's present state, sharing its compiled grammar: one for each
// of several sessions on one grammar. Not while a session in another goroutine uses c.
func (c *Constraint) Fork() (*Constraint, error) {
	p, err := c.raw()
	if err != nil {
		return nil, err
	}
	var out *C.specinfer_constraint
	var msg *C.char
	err = checkMsg(C.specinfer_constraint_fork(p, &out, &msg), msg)
	runtime.KeepAlive(c)
	if err != nil {
		return nil, err
	}
	return newConstraint(out, c.target), nil
}

// Close frees the constraint. It fails with StateError (and the constraint stays open) while a
// session uses it: close the session, or clear its constraint, first. Closing twice is a no-op.
func (c *Constraint) Close() error {
	if c.ptr == nil {
		return nil
	}
	if st := C.specinfer_constraint_destroy(c.ptr); st != C.SPECINFER_OK {
		return checkWith(st, C.specinfer_constraint_errmsg(c.ptr))
	}
	c.ptr = nil
	live.Add(-1)
	runtime.SetFinalizer(c, nil)
	return nil
}

// SetConstraint makes the text the session generates from its next round on match c (nil: no
// constraint). c starts from its state when set, and each feed or Reset takes it back there, so
// every generation after a prompt matches the grammar from its start. The target's scores of the
// tokens c rules out are masked before sampling and coupling: greedy text is the constrained
// plain text, sampled text follows the masked target distribution, whatever the drafter. The text
// ends where the grammar ends (or at an end-of-generation token it allows there); a further round
// fails with StateError until the session is fed, reset or its constraint cleared.
//
// c must have been opened for the session's target or a target sharing its model. The session
// keeps c reachable until it is closed or its constraint replaced; c.Close fails meanwhile.
// Errors: StateError (another session uses c), InvalidArgument (c is closed, or for another
// model's vocabulary).
func (s *Session) SetConstraint(c *Constraint) error {
	p, err := s.raw()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(s)
	var cp *C.specinfer_constraint
	if c != nil {
		if cp, err = c.raw(); err != nil {
			return err
		}
		defer runtime.KeepAlive(c)
	}
	if err := s.check(C.specinfer_session_set_constraint(p, cp)); err != nil {
		return err
	}
	s.constraint = c
	return nil
}
