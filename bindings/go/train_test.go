package specinfer

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// trainProbePlugin compiles ../testdata/train_probe.c (a drafter plugin whose training only
// reports progress and writes down its parameters) into a temporary directory and returns the
// plugin's path; it skips the test when there is no C compiler.
func trainProbePlugin(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the train-probe plugin", cc)
	}
	inc, err := exec.Command("pkg-config", "--variable=includedir", "specinfer").Output()
	if err != nil {
		t.Fatalf("pkg-config: %v", err)
	}
	so := filepath.Join(t.TempDir(), "train-probe.so")
	out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, "-I"+strings.TrimSpace(string(inc)),
		"../testdata/train_probe.c").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return so
}

func checkErr(t *testing.T, err error, code Code, part string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, part) {
		t.Fatalf("want %v containing %q, got %v", code, part, err)
	}
}

func TestDraftersWithNothingToTrainAreUnsupported(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	b, c := 0, 0
	noErr(t, r.RegisterDrafter("lookup-go", "", func(string, ModelInfo) (Drafter, error) {
		return &lookup{nMax: 2, begins: &b, commits: &c}, nil
	}))
	tg := kgram(t, r, 4)
	defer tg.Close()
	out := filepath.Join(t.TempDir(), "heads.gguf")
	for _, plugin := range []string{"ngram", "kgram", "lookup-go"} {
		called := false
		err := r.TrainDrafter(plugin, tg, TrainParams{Corpus: []string{corpus(t)}, OutPath: out,
			Progress: func(TrainProgress) bool { called = true; return true }})
		checkErr(t, err, Unsupported, "'"+plugin+"' has nothing to train")
		if called {
			t.Fatalf("%s: progress called", plugin)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("%s was written", out)
	}
	// The target is still usable afterwards.
	if text, _ := generate(t, tg, nil, nil, 20); text == "" {
		t.Fatal("no text after training refusals")
	}
}

func TestBadTrainingArgumentsAreErrors(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := kgram(t, r, 4)
	out := filepath.Join(t.TempDir(), "heads.gguf")
	ok := TrainParams{Corpus: []string{corpus(t)}, OutPath: out}
	checkErr(t, r.TrainDrafter("ngram", tg, TrainParams{Corpus: ok.Corpus}), InvalidArgument, "out_path")
	checkErr(t, r.TrainDrafter("no-such-plugin", tg, ok), NotFound, "no-such-plugin")
	checkErr(t, r.TrainDrafter("gguf", tg, ok), NotFound, "no drafter")
	checkErr(t, r.TrainDrafter("ng\x00ram", tg, ok), InvalidArgument, "NUL")
	checkErr(t, r.TrainDrafter("ngram", tg, TrainParams{Config: "a\x00b", OutPath: out}), InvalidArgument, "NUL")
	checkErr(t, r.TrainDrafter("ngram", tg, TrainParams{Corpus: []string{"a\x00b"}, OutPath: out}), InvalidArgument, "NUL")
	// A target that a session uses is not the trainer's.
	s := must(NewSession(tg, nil, nil, DefaultSessionParams()))
	checkErr(t, r.TrainDrafter("ngram", tg, ok), StateError, "session")
	noErr(t, s.Close())
	noErr(t, tg.Close())
	checkErr(t, r.TrainDrafter("ngram", tg, ok), InvalidArgument, "closed")
	checkErr(t, r.TrainDrafter("ngram", nil, ok), InvalidArgument, "closed")
}

type report struct {
	stage       string
	done, total int64
	loss        float64 // -1 for NaN, so that reports compare with ==
	accuracy    []float32
}

func TestTrainingProgressAndParametersCrossTheABI(t *testing.T) {
	plugin := trainProbePlugin(t)
	r := must(NewRegistry(2))
	defer r.Close()
	noErr(t, r.LoadPlugin(plugin))
	tg := kgram(t, r, 4)
	defer tg.Close()
	out := filepath.Join(t.TempDir(), "heads.gguf")

	// Every report arrives, in order, with its fields; then the parameters are written down.
	var seen []report
	noErr(t, r.TrainDrafter("train-probe", tg, TrainParams{
		Config: "heads=2,epochs=1", Corpus: []string{"/data/a.txt", "/data/b b.txt"}, OutPath: out,
		Progress: func(p TrainProgress) bool {
			loss := p.Loss
			if math.IsNaN(loss) {
				loss = -1
			}
			seen = append(seen, report{p.Stage, p.Done, p.Total, loss, p.Accuracy})
			return true
		},
	}))
	want := []report{
		{"collect", 0, 2, -1, nil}, {"collect", 1, 2, -1, nil}, {"collect", 2, 2, -1, nil},
		{"train", 1, 2, 2.5, nil}, {"train", 2, 2, 1.5, nil}, {"evaluate", 1, 1, 1.5, []float32{0.5, 0.25}},
	}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("progress reports\n%v\nwant\n%v", seen, want)
	}
	if b := must(os.ReadFile(out)); string(b) != "config=heads=2,epochs=1\ncorpus=2\n/data/a.txt\n/data/b b.txt\n" {
		t.Fatalf("written: %q", b)
	}

	// No callback, no config, no corpus: the plugin gets NULLs and zero.
	noErr(t, r.TrainDrafter("train-probe", tg, TrainParams{OutPath: out}))
	if b := must(os.ReadFile(out)); string(b) != "config=(null)\ncorpus=0\n" {
		t.Fatalf("written: %q", b)
	}

	// Returning false cancels at once.
	noErr(t, os.Remove(out))
	calls := 0
	err := r.TrainDrafter("train-probe", tg, TrainParams{Corpus: []string{corpus(t)}, OutPath: out,
		Progress: func(p TrainProgress) bool { calls++; return p.Stage != "train" }})
	checkErr(t, err, Cancelled, "train-probe: cancelled during train 1")
	if calls != 4 {
		t.Fatalf("%d progress calls", calls)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("%s was written", out)
	}

	// The plugin's own refusal comes back with its code and message.
	checkErr(t, r.TrainDrafter("train-probe", tg, TrainParams{Config: "fail=1", OutPath: out}), ConfigError,
		"train-probe: asked to fail")

	// A panic in the callback stops the training and is raised again here.
	func() {
		defer func() {
			if p := recover(); p != "progress bug 9" {
				t.Fatalf("recovered %v", p)
			}
		}()
		_ = r.TrainDrafter("train-probe", tg, TrainParams{OutPath: out,
			Progress: func(TrainProgress) bool { panic("progress bug 9") }})
		t.Fatal("no panic")
	}()
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("%s was written", out)
	}
}
