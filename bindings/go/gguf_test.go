package specinfer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A real model (Qwen2.5-Coder 0.5B, from scripts/fetch-models) with a Go drafter; skipped when
// the file is absent ($SPECINFER_MODELS, default ~/.cache/specinfer/models).
func TestGoDrafterOnARealModel(t *testing.T) {
	dir := os.Getenv("SPECINFER_MODELS")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "specinfer", "models")
	}
	model := filepath.Join(dir, "qwen2.5-coder-0.5b.gguf")
	if _, err := os.Stat(model); err != nil {
		t.Skipf("%s not found (scripts/fetch-models)", model)
	}
	const prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
	r := must(NewRegistry(2))
	defer r.Close()
	b, c := 0, 0
	noErr(t, r.RegisterDrafter("lookup-go", "", func(string, ModelInfo) (Drafter, error) {
		return &lookup{nMax: 2, begins: &b, commits: &c}, nil
	}))
	tg := must(r.OpenTarget("gguf", "path="+model))
	defer tg.Close()
	if info := must(tg.Info()); info.Arch != "qwen2" {
		t.Fatalf("arch %q", info.Arch)
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
}
