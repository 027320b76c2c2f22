package specinfer

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const prompt = "/* Creates a session that generates with"

// corpus is the training text of the kgram target: $SPECINFER_TEST_CORPUS, else abi/specinfer.h.
func corpus(t *testing.T) string {
	if p := os.Getenv("SPECINFER_TEST_CORPUS"); p != "" {
		return p
	}
	p, err := filepath.Abs("../../abi/specinfer.h")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// must returns v, or panics (failing the test) on an error.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func kgram(t *testing.T, r *Registry, k int) *Target {
	t.Helper()
	return must(r.OpenTarget("kgram", "path="+corpus(t)+",k="+strconv.Itoa(k)))
}

func generate(t *testing.T, tg *Target, d *DrafterHandle, c *Coupler, max int) (string, Stats) {
	t.Helper()
	p := DefaultSessionParams()
	p.MaxDraft = 6
	s := must(NewSession(tg, d, c, p))
	defer s.Close()
	if err := s.FeedText(prompt); err != nil {
		t.Fatal(err)
	}
	text := must(s.Generate(max))
	return text, must(s.Stats())
}

// plainAndSpec is plain and speculative decoding of the same text.
type plainAndSpec struct {
	plain, spec       string
	plainStats, stats Stats
}

// runPlainAndSpec generates max tokens after the prompt on a 6-gram kgram target, plain and then
// with drafter name (opened with config) and coupler c (nil: greedy).
func runPlainAndSpec(t *testing.T, r *Registry, name, config string, c *Coupler, max int) plainAndSpec {
	t.Helper()
	tg := kgram(t, r, 6)
	defer tg.Close()
	var run plainAndSpec
	run.plain, run.plainStats = generate(t, tg, nil, nil, max)
	d := must(r.OpenDrafter(name, config, tg))
	defer d.Close()
	run.spec, run.stats = generate(t, tg, d, c, max)
	return run
}

// lookup is a prompt-lookup drafter written in Go: it finds the latest earlier occurrence of
// the context's last n tokens and proposes what followed.
type lookup struct {
	nMax            int
	begins, commits *int
}

func (l *lookup) Begin(ctx []int32) error { *l.begins++; return nil }
func (l *lookup) Commit(tokens []int32) error {
	*l.commits++
	return nil
}
func (l *lookup) Propose(req *DraftRequest) (Draft, error) {
	ctx := req.Context
	for n := min(l.nMax, len(ctx)-1); n >= 1; n-- {
		tail := ctx[len(ctx)-n:]
		for s := len(ctx) - n - 1; s >= 0; s-- {
			if equal(ctx[s:s+n], tail) {
				end := min(s+n+req.MaxTokens, len(ctx))
				return Draft{Tokens: append([]int32(nil), ctx[s+n:end]...)}, nil
			}
		}
	}
	return Draft{}, nil
}

func equal(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func TestNgramDrafterGivesPlainGreedyText(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	c := must(NewCoupler("greedy"))
	defer c.Close()
	run := runPlainAndSpec(t, r, "ngram", "n_max=4", c, 300)
	if run.spec != run.plain || run.plain == "" {
		t.Fatalf("speculative text differs:\n%q\n%q", run.spec, run.plain)
	}
	st, st0 := run.stats, run.plainStats
	if st.NAccepted == 0 || st.NTargetPasses >= st0.NTargetPasses || st.NGenerated != 300 {
		t.Fatalf("stats %+v vs %+v", st, st0)
	}
}

func TestGoDrafterGivesPlainGreedyText(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	begins, commits := 0, 0
	err := r.RegisterDrafter("lookup-go", "prompt lookup in Go", func(cfg string, info ModelInfo) (Drafter, error) {
		if cfg != "" {
			return nil, NewError(ConfigError, "lookup-go takes no config, got '%s'", cfg)
		}
		if info.VocabSize != 256 {
			return nil, errors.New("unexpected vocabulary")
		}
		return &lookup{nMax: 3, begins: &begins, commits: &commits}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	plugins := must(r.Plugins())
	found := false
	for _, p := range plugins {
		if p.Name == "lookup-go" {
			found = p.HasDrafter && !p.HasTarget && p.Path == ""
		}
	}
	if !found {
		t.Fatalf("lookup-go not listed right: %+v", plugins)
	}
	for _, spec := range []string{"greedy", "gumbel"} {
		c := must(NewCoupler(spec))
		b0 := begins
		run := runPlainAndSpec(t, r, "lookup-go", "", c, 300)
		if run.spec != run.plain {
			t.Fatalf("%s: Go drafter text differs:\n%q\n%q", spec, run.spec, run.plain)
		}
		if run.stats.NAccepted == 0 || begins != b0+1 || commits == 0 {
			t.Fatalf("%s: stats %+v, begins %d, commits %d", spec, run.stats, begins, commits)
		}
		noErr(t, c.Close())
	}
	tg := kgram(t, r, 6)
	defer tg.Close()
	_, err = r.OpenDrafter("lookup-go", "x=1", tg)
	var e *Error
	if !errors.As(err, &e) || e.Code != ConfigError || !strings.Contains(e.Message, "lookup-go takes no config, got 'x=1'") {
		t.Fatalf("factory refusal: %v", err)
	}
	if err := r.RegisterDrafter("lookup-go", "", func(string, ModelInfo) (Drafter, error) { return nil, nil }); !errors.Is(err, &Error{Code: StateError}) {
		t.Fatalf("second registration: %v", err)
	}
}

// seenRequest is what a drafter saw in one request.
type seenRequest struct {
	hidden            []float32 // a copy; nil when the request had none
	hiddenPosition    int64
	passCost          []float32 // a copy
	nContext, maxToks int
}

// probe records what each request holds, then drafts by prompt lookup.
type probe struct {
	lookup
	seen *[]seenRequest
}

func (p *probe) Propose(req *DraftRequest) (Draft, error) {
	s := seenRequest{hiddenPosition: req.HiddenPosition, passCost: append([]float32(nil), req.PassCost...),
		nContext: len(req.Context), maxToks: req.MaxTokens}
	if req.Hidden != nil {
		s.hidden = append([]float32{}, req.Hidden...)
	}
	*p.seen = append(*p.seen, s)
	return p.lookup.Propose(req)
}

// checkSeen checks the requests a probe saw: hidden states of hiddenSize floats at len(Context)
// - 2 (some, when wantHidden; none otherwise), and MaxTokens + 1 pass costs starting at 1.
func checkSeen(t *testing.T, seen []seenRequest, hiddenSize int, wantHidden bool) {
	t.Helper()
	if len(seen) == 0 {
		t.Fatal("the drafter saw no request")
	}
	withHidden := 0
	for _, s := range seen {
		if s.hidden != nil {
			withHidden++
			if len(s.hidden) != hiddenSize || s.hiddenPosition != int64(s.nContext-2) {
				t.Fatalf("hidden state of %d floats at %d, context %d", len(s.hidden), s.hiddenPosition, s.nContext)
			}
		} else if s.hiddenPosition != -1 {
			t.Fatalf("no hidden state, position %d", s.hiddenPosition)
		}
		if len(s.passCost) != s.maxToks+1 || s.passCost[0] != 1 {
			t.Fatalf("pass costs %v for max_tokens %d", s.passCost, s.maxToks)
		}
		for _, c := range s.passCost {
			if !(c > 0) || math.IsInf(float64(c), 0) {
				t.Fatalf("pass costs %v", s.passCost)
			}
		}
	}
	if wantHidden != (withHidden > 0) {
		t.Fatalf("%d of %d requests carried a hidden state", withHidden, len(seen))
	}
}

func TestGoDrafterSeesNoHiddenStateAndThePassCostsWithKgram(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	var seen []seenRequest
	b, c := 0, 0
	noErr(t, r.RegisterDrafter("probe-go", "", func(string, ModelInfo) (Drafter, error) {
		return &probe{lookup: lookup{nMax: 3, begins: &b, commits: &c}, seen: &seen}, nil
	}))
	run := runPlainAndSpec(t, r, "probe-go", "", nil, 200)
	if run.spec != run.plain || run.stats.NDrafted == 0 {
		t.Fatalf("%+v:\n%q\n%q", run.stats, run.spec, run.plain)
	}
	// kgram has no hidden state (hidden_size 0).
	checkSeen(t, seen, 0, false)
}

// expecting is prompt lookup that expects the target to keep half of each draft
// (Draft.ExpectedAccepted) and sums what it said.
type expecting struct {
	lookup
	said   float64
	rounds int
}

func (e *expecting) Propose(req *DraftRequest) (Draft, error) {
	d, err := e.lookup.Propose(req)
	if err != nil || len(d.Tokens) == 0 {
		return d, err
	}
	half := float64(len(d.Tokens)) / 2
	e.said += half
	e.rounds++
	d.ExpectedAccepted = &half
	return d, nil
}

func TestGoDrafterReportsTheAcceptedLengthItExpects(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	var made *expecting
	var begins, commits int
	noErr(t, r.RegisterDrafter("expecting-go", "", func(string, ModelInfo) (Drafter, error) {
		made = &expecting{lookup: lookup{nMax: 3, begins: &begins, commits: &commits}}
		return made, nil
	}))
	run := runPlainAndSpec(t, r, "expecting-go", "", nil, 200)
	st := run.stats
	if run.spec != run.plain || made.rounds == 0 || st.NEstimatedRounds != int64(made.rounds) ||
		math.Abs(st.ExpectedAccepted-made.said) > 1e-9 ||
		!(st.EstimatedRoundsAccepted > 0 && st.EstimatedRoundsAccepted <= float64(st.NAccepted)) {
		t.Fatalf("rounds %d said %g: %+v", made.rounds, made.said, st)
	}
}

type failing struct{ panic bool }

func (f *failing) Begin([]int32) error  { return nil }
func (f *failing) Commit([]int32) error { return nil }
func (f *failing) Propose(*DraftRequest) (Draft, error) {
	if f.panic {
		panic("drafter bug 7")
	}
	return Draft{}, errors.New("the oracle is out of tea")
}

func TestDrafterErrorsReachTheCaller(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	noErr(t, r.RegisterDrafter("failing-go", "", func(cfg string, _ ModelInfo) (Drafter, error) {
		return &failing{panic: cfg == "panic=1"}, nil
	}))
	noErr(t, r.RegisterDrafter("bad-go", "", func(cfg string, _ ModelInfo) (Drafter, error) {
		return badDrafter{expected: cfg == "expected=1"}, nil
	}))
	tg := kgram(t, r, 4)
	defer tg.Close()
	for _, c := range []struct{ plugin, cfg, want string }{
		{"failing-go", "", "the oracle is out of tea"},
		{"failing-go", "panic=1", "drafter bug 7"},
		{"bad-go", "", "outside the vocabulary"},
		{"bad-go", "expected=1", "expects 3 accepted tokens, not within 0..2"},
	} {
		d := must(r.OpenDrafter(c.plugin, c.cfg, tg))
		s := must(NewSession(tg, d, nil, DefaultSessionParams()))
		noErr(t, s.FeedText(prompt))
		_, err := s.Generate(20)
		var e *Error
		if !errors.As(err, &e) || e.Code != PluginError && e.Code != InvalidArgument || !strings.Contains(e.Message, c.want) {
			t.Fatalf("%s %s: %v", c.plugin, c.cfg, err)
		}
		s.Close()
		d.Close()
	}
}

// badDrafter proposes a token outside the vocabulary, or (expected) expects more tokens kept
// than it drafts.
type badDrafter struct{ expected bool }

func (badDrafter) Begin([]int32) error  { return nil }
func (badDrafter) Commit([]int32) error { return nil }
func (b badDrafter) Propose(*DraftRequest) (Draft, error) {
	if b.expected {
		three := 3.0
		return Draft{Tokens: []int32{1, 2}, ExpectedAccepted: &three}, nil
	}
	return Draft{Tokens: []int32{100000}}, nil
}

func TestStreamYieldsTheGeneratedText(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := kgram(t, r, 6)
	defer tg.Close()
	whole, _ := generate(t, tg, nil, nil, 120)
	d := must(r.OpenDrafter("ngram", "", tg))
	defer d.Close()
	p := DefaultSessionParams()
	p.MaxDraft = 6
	s := must(NewSession(tg, d, nil, p))
	defer s.Close()
	noErr(t, s.FeedText(prompt))
	var chunks []string
	for chunk, err := range s.Stream(120) {
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, chunk)
	}
	st := must(s.Stats())
	if strings.Join(chunks, "") != whole || len(chunks) < 2 || int64(len(chunks)) != st.NRounds || st.NGenerated != 120 {
		t.Fatalf("%d chunks, %+v:\n%q\n%q", len(chunks), st, strings.Join(chunks, ""), whole)
	}
	toks := must(s.Tokens())
	if int64(len(toks)) != st.NPromptTokens+120 {
		t.Fatalf("%d tokens", len(toks))
	}
	// Breaking out of the loop stops generating.
	noErr(t, s.Reset())
	noErr(t, s.FeedText(prompt))
	for range s.Stream(120) {
		break
	}
	if st := must(s.Stats()); st.NRounds != 1 {
		t.Fatalf("after break: %+v", st)
	}
}

func TestStopStringsEndTheTextBeforeThem(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := kgram(t, r, 6)
	defer tg.Close()
	whole, _ := generate(t, tg, nil, nil, 120)
	stop := whole[40:46]
	cut := strings.Index(whole, stop)
	d := must(r.OpenDrafter("ngram", "", tg))
	defer d.Close()
	p := DefaultSessionParams()
	p.MaxDraft = 6
	s := must(NewSession(tg, d, nil, p))
	defer s.Close()
	noErr(t, s.SetStopStrings([]string{stop, "\x01never"}))
	noErr(t, s.FeedText(prompt))
	var text strings.Builder
	for chunk, err := range s.Stream(120) {
		noErr(t, err)
		text.WriteString(chunk)
	}
	if text.String() != whole[:cut] {
		t.Fatalf("stopped text %q, want %q", text.String(), whole[:cut])
	}
	st := must(s.Stats())
	if toks := must(s.Tokens()); int64(len(toks)) != st.NPromptTokens+int64(cut+len(stop)) {
		t.Fatalf("%d tokens, want %d", len(toks), st.NPromptTokens+int64(cut+len(stop)))
	}
	// Held back while it may begin a stop string; EndText releases it at the caller's budget.
	noErr(t, s.Reset())
	noErr(t, s.SetStopStrings([]string{whole[29:30] + "\x01"}))
	noErr(t, s.FeedText(prompt))
	var held strings.Builder
	for i := 0; i < 30; i++ {
		toks, done, err := s.Step(1)
		noErr(t, err)
		if len(toks) != 1 || done {
			t.Fatalf("round %d: %d tokens, done %v", i, len(toks), done)
		}
		held.WriteString(must(s.StepText()))
	}
	if held.String() != whole[:29] || must(s.EndText()) != whole[29:30] {
		t.Fatalf("held-back text: %q", held.String())
	}
	var e *Error
	if err := s.SetStopStrings(make([]string, 65)); !errors.As(err, &e) || e.Code != InvalidArgument {
		t.Fatalf("65 stop strings: %v", err)
	}
	if err := s.SetStopStrings([]string{"a\x00b"}); !errors.As(err, &e) || e.Code != InvalidArgument {
		t.Fatalf("a NUL byte: %v", err)
	}
	if _, _, err := s.Step(0); !errors.As(err, &e) || e.Code != BufferTooSmall {
		t.Fatalf("Step(0): %v", err)
	}
	noErr(t, s.SetStopStrings(nil))
}

func TestBadInputGivesErrorsWithTheLibraryMessage(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	check := func(err error, code Code, part string) {
		t.Helper()
		var e *Error
		if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, part) {
			t.Fatalf("want %v containing %q, got %v", code, part, err)
		}
	}
	_, err := r.OpenTarget("no-such-plugin", "")
	check(err, NotFound, "no-such-plugin")
	_, err = r.OpenTarget("kgram", "path="+corpus(t)+",bogus=3")
	check(err, ConfigError, "bogus")
	_, err = NewCoupler("lenient:7")
	check(err, ConfigError, "")
	if !strings.HasPrefix(err.Error(), "SPECINFER_ERR_CONFIG: ") {
		t.Fatalf("message %q", err.Error())
	}
	tg := kgram(t, r, 4)
	defer tg.Close()
	p := DefaultSessionParams()
	p.Temperature = -1
	_, err = NewSession(tg, nil, nil, p)
	check(err, InvalidArgument, "temperature")
	s := must(NewSession(tg, nil, nil, DefaultSessionParams()))
	_, err = s.Generate(10)
	check(err, StateError, "feed")
	check(s.FeedTokens([]int32{7, 999}), InvalidArgument, "")
	_, err = tg.Detokenize([]int32{300})
	check(err, InvalidArgument, "")
	// Closing the target while a session uses it is refused.
	check(tg.Close(), StateError, "")
	noErr(t, s.FeedText(prompt))
	err = s.GenerateFunc(50, func([]int32, string) bool { return false })
	check(err, Cancelled, "")
	s.Close()
	ids := must(tg.Tokenize("héllo", false, false))
	if b := must(tg.Detokenize(ids)); len(ids) != 6 || string(b) != "héllo" {
		t.Fatalf("round trip %v %q", ids, b)
	}
	c := must(NewCoupler("rejection"))
	defer c.Close()
	if n, tok, err := c.Verify(2, []float32{0, 1, 0, 1}, nil, []int32{1}, 7, 3); err != nil || n != 1 || tok != 1 {
		t.Fatalf("verify %d %d %v", n, tok, err)
	}
	_, _, err = c.Verify(2, []float32{0.5, 0.7, 0, 1}, nil, []int32{1}, 7, 3)
	check(err, InvalidArgument, "")
}

func TestConcurrentSessions(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	c := must(NewCoupler("greedy"))
	defer c.Close()
	tg := kgram(t, r, 6)
	plain, _ := generate(t, tg, nil, nil, 80)
	tg.Close()
	var wg sync.WaitGroup
	texts := make([]string, 3)
	for i := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tg := kgram(t, r, 6)
			defer tg.Close()
			d := must(r.OpenDrafter("ngram", "", tg))
			defer d.Close()
			texts[i], _ = generate(t, tg, d, c, 80)
		}()
	}
	wg.Wait()
	for _, s := range texts {
		if s != plain {
			t.Fatalf("%q != %q", s, plain)
		}
	}
}

// TestNoHandleLeaks checks that Close frees everything, and that finalizers free what was never
// closed. (The tests of this package do not run in parallel, so the count is this test's own.)
func TestNoHandleLeaks(t *testing.T) {
	base := LiveHandles()
	func() {
		r := must(NewRegistry(1))
		defer r.Close()
		begins, commits := 0, 0
		noErr(t, r.RegisterDrafter("leak-go", "", func(string, ModelInfo) (Drafter, error) {
			return &lookup{nMax: 2, begins: &begins, commits: &commits}, nil
		}))
		tg := kgram(t, r, 4)
		d := must(r.OpenDrafter("leak-go", "", tg))
		if got := LiveHandles() - base; got != 4 { // registry, target, drafter, Go instance
			t.Fatalf("%d live handles", got)
		}
		generate(t, tg, d, nil, 40)
		noErr(t, d.Close())
		noErr(t, tg.Close())
		noErr(t, r.UnloadPlugin("leak-go"))
	}()
	if got := LiveHandles() - base; got != 0 {
		t.Fatalf("%d handles leaked after Close", got)
	}
	// Never closed: the finalizers free them, sessions before constraints and drafters before
	// targets before the registry.
	func() {
		r := must(NewRegistry(1))
		tg := kgram(t, r, 4)
		d := must(r.OpenDrafter("ngram", "", tg))
		c := must(NewCoupler("greedy"))
		s := must(NewSession(tg, d, c, DefaultSessionParams()))
		// A constraint too, when the plugin is there: freed after the session, before the target.
		if cs, err := r.OpenConstraint("llguidance", "", tg, "regex", "[a-e]+"); err == nil {
			noErr(t, s.SetConstraint(cs))
		}
		noErr(t, s.FeedText(prompt))
		must(s.Generate(20))
	}()
	deadline := time.Now().Add(20 * time.Second)
	for LiveHandles() != base && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := LiveHandles() - base; got != 0 {
		t.Fatalf("%d handles still live after GC", got)
	}
}

func TestContextShiftGoesOnPastAFullWindow(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := must(r.OpenTarget("kgram", "path="+corpus(t)+",k=4,n_ctx=64"))
	defer tg.Close()
	s := must(NewSession(tg, nil, nil, DefaultSessionParams()))
	if err := s.FeedText(prompt); err != nil {
		t.Fatal(err)
	}
	var e *Error
	if _, err := s.Generate(200); !errors.As(err, &e) || e.Code != ContextFull {
		t.Fatalf("a full window without context shift: %v", err)
	}
	s.Close()
	p := DefaultSessionParams()
	p.ContextShift, p.NKeep = true, 8
	s = must(NewSession(tg, nil, nil, p))
	defer s.Close()
	if err := s.FeedText(prompt); err != nil {
		t.Fatal(err)
	}
	must(s.Generate(200))
	st := must(s.Stats())
	if st.NGenerated != 200 || st.NContextShifts < 3 {
		t.Fatalf("stats: %+v", st)
	}
}
