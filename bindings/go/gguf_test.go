package specinfer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realModel is the path of Qwen2.5-Coder 0.5B (from scripts/fetch-models); it skips the test
// when the file is absent ($SPECINFER_MODELS, default ~/.cache/specinfer/models).
func realModel(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SPECINFER_MODELS")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "specinfer", "models")
	}
	model := filepath.Join(dir, "qwen2.5-coder-0.5b.gguf")
	if _, err := os.Stat(model); err != nil {
		t.Skipf("%s not found (scripts/fetch-models)", model)
	}
	return model
}

// A real model with a Go drafter.
func TestGoDrafterOnARealModel(t *testing.T) {
	model := realModel(t)
	const prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
	r := must(NewRegistry(2))
	defer r.Close()
	b, c := 0, 0
	var seen []seenRequest
	noErr(t, r.RegisterDrafter("lookup-go", "", func(string, ModelInfo) (Drafter, error) {
		return &probe{lookup: lookup{nMax: 2, begins: &b, commits: &c}, seen: &seen}, nil
	}))
	tg := must(r.OpenTarget("gguf", "path="+model))
	defer tg.Close()
	info := must(tg.Info())
	if info.Arch != "qwen2" {
		t.Fatalf("arch %q", info.Arch)
	}
	if !strings.Contains(info.ChatTemplate, "<|im_start|>") { // Qwen2.5's GGUF carries its template
		t.Fatalf("chat template %q", info.ChatTemplate)
	}
	run := func(d *DrafterHandle) (string, Stats) {
		p := DefaultSessionParams()
		p.MaxDraft = 4
		s := must(NewSession(tg, d, nil, p))
		defer s.Close()
		noErr(t, s.FeedText(prompt))
		var sb strings.Builder
		for chunk, err := range s.Stream(40) {
			noErr(t, err)
			sb.WriteString(chunk)
		}
		return sb.String(), must(s.Stats())
	}
	plain, st0 := run(nil)
	d := must(r.OpenDrafter("lookup-go", "", tg))
	defer d.Close()
	spec, st := run(d)
	if spec != plain || strings.TrimSpace(plain) == "" || st.NGenerated != st0.NGenerated || st.NDrafted == 0 {
		t.Fatalf("%+v vs %+v:\n%q\n%q", st, st0, spec, plain)
	}
	// The drafter gets the target's hidden state of the position that chose the last token.
	checkSeen(t, seen, info.HiddenSize, true)
}

// Medusa heads trained on the real model stop as soon as the progress callback says so.
func TestMedusaTrainingOnARealModelStopsWhenProgressSaysSo(t *testing.T) {
	model := realModel(t)
	r := must(NewRegistry(2))
	defer r.Close()
	tg := must(r.OpenTarget("gguf", "path="+model))
	defer tg.Close()
	out := filepath.Join(t.TempDir(), "heads.gguf")
	var seen []TrainProgress
	err := r.TrainDrafter("medusa", tg, TrainParams{Corpus: []string{corpus(t)}, OutPath: out,
		Progress: func(p TrainProgress) bool { seen = append(seen, p); return false }})
	checkErr(t, err, Cancelled, "")
	if len(seen) != 1 || seen[0].Stage != "collect" || seen[0].Total <= 0 {
		t.Fatalf("progress reports %+v", seen)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("%s was written", out)
	}
}
