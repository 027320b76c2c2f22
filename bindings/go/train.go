package specinfer

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"math"
	"runtime"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// TrainParams are what TrainDrafter trains from and where it writes.
type TrainParams struct {
	Config  string   // the drafter's own key=value,... training options ("" for its defaults)
	Corpus  []string // text files to learn from (never the prompts an evaluation measures on)
	OutPath string   // the file to write; checkpoints are kept beside it
	// Progress, when not nil, is called now and then, from one goroutine at a time; returning
	// false stops the training (TrainDrafter then returns an error with code Cancelled). A panic
	// in it stops the training too and is raised again in TrainDrafter's caller.
	Progress func(TrainProgress) bool
}

// TrainProgress is one report of a training's progress.
type TrainProgress struct {
	Stage       string    // "collect" (running the target over the corpus), "train" or "evaluate"
	Done, Total int64     // units of the stage done and in all (tokens, steps)
	Loss        float64   // mean training loss over recent steps; NaN before the first
	Accuracy    []float32 // per head, top-1 agreement with the target on held-out text; nil before the first evaluation
}

type progressCallback struct {
	fn    func(TrainProgress) bool
	panic any
}

// Where the fields of a progress report end, to read only those its struct_size covers.
const (
	progressStageEnd    = unsafe.Offsetof(C.specinfer_train_progress{}.stage) + unsafe.Sizeof((*C.char)(nil))
	progressCountsEnd   = unsafe.Offsetof(C.specinfer_train_progress{}.total) + unsafe.Sizeof(C.int64_t(0))
	progressLossEnd     = unsafe.Offsetof(C.specinfer_train_progress{}.loss) + unsafe.Sizeof(C.double(0))
	progressAccuracyEnd = unsafe.Offsetof(C.specinfer_train_progress{}.accuracy) + unsafe.Sizeof((*C.float)(nil))
)

//export goSpecinferTrainProgress
func goSpecinferTrainProgress(h C.uintptr_t, p *C.specinfer_train_progress) C.int {
	cb := cgo.Handle(h).Value().(*progressCallback)
	if cb.panic != nil {
		return 1
	}
	if p == nil {
		return 0
	}
	size := uintptr(p.struct_size)
	pr := TrainProgress{Loss: math.NaN()}
	if size >= progressStageEnd && p.stage != nil {
		pr.Stage = C.GoString(p.stage)
	}
	if size >= progressCountsEnd {
		pr.Done, pr.Total = int64(p.done), int64(p.total)
	}
	if size >= progressLossEnd {
		pr.Loss = float64(p.loss)
	}
	if size >= progressAccuracyEnd && p.accuracy != nil && p.n_heads > 0 {
		pr.Accuracy = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p.accuracy)), int(p.n_heads))...)
	}
	goOn := false
	func() {
		defer func() {
			if r := recover(); r != nil {
				cb.panic = r
			}
		}()
		goOn = cb.fn(pr)
	}()
	if goOn {
		return 0
	}
	return 1
}

// cString is C.CString that refuses strings with a NUL byte (C would see them cut short).
func cString(what, s string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, NewError(InvalidArgument, "%s contains a NUL byte", what)
	}
	return C.CString(s), nil
}

// TrainDrafter trains the weights of the drafter plugin plugin (e.g. "medusa") for target and
// writes them to params.OutPath; open the result with OpenDrafter (for medusa: config
// "path=<OutPath>"). The target is the trainer's for the whole call: no session may use it.
// Errors: Unsupported when the plugin has nothing to train (every drafter but medusa, and Go
// drafters), NotFound, InvalidArgument (e.g. an empty OutPath), ConfigError, IOError, Cancelled
// when Progress stopped it, StateError when a session uses the target, and the plugin's own.
func (r *Registry) TrainDrafter(plugin string, target *Target, params TrainParams) error {
	p, err := r.raw()
	if err != nil {
		return err
	}
	tp, err := target.raw()
	if err != nil {
		return err
	}
	var cs []*C.char // every C string made here, freed on return
	defer func() {
		for _, s := range cs {
			C.free(unsafe.Pointer(s))
		}
	}()
	str := func(what, s string) (*C.char, error) {
		c, err := cString(what, s)
		if err == nil {
			cs = append(cs, c)
		}
		return c, err
	}
	var tr C.specinfer_train_params
	C.specinfer_train_params_init(&tr)
	cplugin, err := str("plugin", plugin)
	if err != nil {
		return err
	}
	if params.Config != "" {
		if tr.config, err = str("config", params.Config); err != nil {
			return err
		}
	}
	if tr.out_path, err = str("OutPath", params.OutPath); err != nil {
		return err
	}
	if n := len(params.Corpus); n > 0 {
		if n > math.MaxInt32 {
			return NewError(InvalidArgument, "%d corpus files are too many", n)
		}
		arr := (**C.char)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		if arr == nil {
			return NewError(OutOfMemory, "cannot allocate the corpus list")
		}
		defer C.free(unsafe.Pointer(arr))
		paths := unsafe.Slice(arr, n)
		for i, path := range params.Corpus {
			if paths[i], err = str("a corpus path", path); err != nil {
				return err
			}
		}
		tr.corpus, tr.n_corpus = arr, C.int32_t(n)
	}
	var cb *progressCallback
	var h cgo.Handle
	if params.Progress != nil {
		cb = &progressCallback{fn: params.Progress}
		h = cgo.NewHandle(cb)
		defer h.Delete()
	}
	var msg *C.char
	st := C.si_go_drafter_train(p, cplugin, tp, &tr, C.uintptr_t(h), &msg)
	runtime.KeepAlive(r)
	runtime.KeepAlive(target)
	if cb != nil && cb.panic != nil {
		C.specinfer_free(unsafe.Pointer(msg))
		panic(cb.panic)
	}
	return checkMsg(st, msg)
}
