package specinfer

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// One loaded model, many users: shares of one kgram target run sessions in several goroutines
// at once, and StepMany steps several sessions together; every text equals a lone session's.

var sharedPrompts = []string{prompt, "typedef struct specinfer_", "/* Runs one round of each"}

func sharedParams() SessionParams {
	p := DefaultSessionParams()
	p.MaxDraft = 6
	return p
}

// loneTokens is the first n tokens a lone session on its own target generates after text.
func loneTokens(t *testing.T, r *Registry, text string, n int, withDrafter bool) []int32 {
	t.Helper()
	tg := kgram(t, r, 6)
	defer tg.Close()
	var d *DrafterHandle
	if withDrafter {
		d = must(r.OpenDrafter("ngram", "", tg))
		defer d.Close()
	}
	s := must(NewSession(tg, d, nil, sharedParams()))
	defer s.Close()
	noErr(t, s.FeedText(text))
	must(s.Generate(n))
	return must(s.Tokens())[len(text):]
}

func TestSharedTargetsRunSessionsConcurrently(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	c := must(NewCoupler("greedy"))
	defer c.Close()
	root := kgram(t, r, 6)
	shares := make([]*Target, 4)
	for i := range shares {
		shares[i] = must(root.Share())
	}
	if a, b := must(root.Info()), must(shares[0].Info()); a != b {
		t.Fatalf("a share describes another model: %+v != %+v", b, a)
	}
	if eog := must(root.EndOfGeneration()); len(eog) != 0 { // kgram has no end tokens
		t.Fatalf("kgram's end-of-generation tokens: %v", eog)
	}
	noErr(t, root.Close()) // the shares keep the model
	want := make([][]int32, len(shares))
	for i := range want {
		want[i] = loneTokens(t, r, sharedPrompts[i%3], 120, i%2 == 0)
	}
	got := make([][]int32, len(shares))
	errs := make([]error, len(shares))
	var wg sync.WaitGroup
	for i, tg := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer tg.Close()
			var d *DrafterHandle
			if i%2 == 0 {
				if d, errs[i] = r.OpenDrafter("ngram", "", tg); errs[i] != nil {
					return
				}
				defer d.Close()
			}
			s, err := NewSession(tg, d, c, sharedParams())
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			text := sharedPrompts[i%3]
			if errs[i] = s.FeedText(text); errs[i] != nil {
				return
			}
			if _, errs[i] = s.Generate(120); errs[i] != nil {
				return
			}
			toks, err := s.Tokens()
			errs[i] = err
			got[i] = toks[len(text):]
		}()
	}
	wg.Wait()
	for i := range shares {
		noErr(t, errs[i])
		if len(got[i]) != 120 || !slices.Equal(got[i], want[i]) {
			t.Fatalf("goroutine %d: %q != %q", i, got[i], want[i])
		}
	}
}

func TestStepManyEqualsLoneSessions(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	const n = 100
	want := make([][]int32, 3)
	for i := range want {
		want[i] = loneTokens(t, r, sharedPrompts[i], n, i != 1)
	}
	root := kgram(t, r, 6)
	defer root.Close()
	for _, chunk := range []int{0, 4} {
		sessions := make([]*Session, 3)
		for i := range sessions {
			tg := must(root.Share())
			defer tg.Close()
			var d *DrafterHandle
			if i != 1 {
				d = must(r.OpenDrafter("ngram", "", tg))
				defer d.Close()
			}
			sessions[i] = must(NewSession(tg, d, nil, sharedParams()))
			defer sessions[i].Close()
			noErr(t, sessions[i].FeedText(sharedPrompts[i]))
		}
		got := make([][]int32, 3)
		texts := make([]string, 3)
		for calls := 0; slices.ContainsFunc(got, func(g []int32) bool { return len(g) < n }); calls++ {
			if calls > 10*n {
				t.Fatal("StepMany makes no progress")
			}
			res, err := StepManyWith(sessions, StepParams{PrefillChunk: chunk})
			noErr(t, err)
			for i, sr := range res {
				if sr.Err != nil || sr.Done {
					t.Fatalf("session %d: %+v", i, sr)
				}
				got[i] = append(got[i], sr.Tokens...)
				texts[i] += sr.Text
			}
		}
		for i := range got {
			// kgram's tokens are bytes: each round's text is its tokens' bytes.
			bytes := make([]byte, len(got[i]))
			for k, tok := range got[i] {
				bytes[k] = byte(tok)
			}
			if texts[i] != string(bytes) {
				t.Fatalf("prefill chunk %d, session %d: text %q != %q", chunk, i, texts[i], bytes)
			}
			if !slices.Equal(got[i][:n], want[i]) {
				t.Fatalf("prefill chunk %d, session %d: %q != %q", chunk, i, got[i][:n], want[i])
			}
		}
	}
}

func TestStepManyErrors(t *testing.T) {
	r := must(NewRegistry(1))
	defer r.Close()
	root := kgram(t, r, 4)
	defer root.Close()
	a, b := must(root.Share()), must(root.Share())
	defer a.Close()
	defer b.Close()
	sa := must(NewSession(a, nil, nil, sharedParams()))
	defer sa.Close()
	sb := must(NewSession(b, nil, nil, sharedParams()))
	defer sb.Close()
	noErr(t, sa.FeedText(prompt))
	check := func(err error, code Code, part string) {
		t.Helper()
		var e *Error
		if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, part) {
			t.Fatalf("want %v containing %q, got %v", code, part, err)
		}
	}
	// A session twice: the library refuses the whole call and nothing runs.
	before := len(must(sa.Tokens()))
	res, err := StepMany([]*Session{sa, sa})
	check(err, InvalidArgument, "same session")
	if res != nil || len(must(sa.Tokens())) != before {
		t.Fatalf("a refused call ran: %v", res)
	}
	_, err = StepManyWith([]*Session{sa}, StepParams{PrefillChunk: -1})
	check(err, InvalidArgument, "")
	// sb has no prompt: its round fails with the library's code and message; sa's runs.
	res, err = StepManyWith([]*Session{sa, sb}, StepParams{PrefillChunk: 0})
	check(err, StateError, "feed")
	if len(res) != 2 || res[0].Err != nil || len(res[0].Tokens) == 0 {
		t.Fatalf("results %+v", res)
	}
	check(res[1].Err, StateError, "feed")
	// A nil or closed session is the caller's mistake too.
	_, err = StepMany([]*Session{sa, nil})
	check(err, InvalidArgument, "session 1")
	if res, err := StepMany(nil); res != nil || err != nil {
		t.Fatalf("no sessions: %v %v", res, err)
	}
}

// A session fed another's prompt (FeedFrom) continues it as a session fed the prompt text does.
// (kgram cannot copy its cache: the prompt is scored again, and the text is the same.)
func TestFeedFromContinuesAnotherSessionsPrompt(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	want := loneTokens(t, r, prompt, 40, false)
	root := kgram(t, r, 6)
	defer root.Close()
	a, b := must(root.Share()), must(root.Share())
	defer a.Close()
	defer b.Close()
	src := must(NewSession(a, nil, nil, sharedParams()))
	defer src.Close()
	s := must(NewSession(b, nil, nil, sharedParams()))
	defer s.Close()
	noErr(t, src.FeedText(prompt))
	must(src.Generate(5))
	noErr(t, s.FeedFrom(src, len(prompt)))
	must(s.Generate(40))
	if got := must(s.Tokens())[len(prompt):]; !slices.Equal(got, want) {
		t.Fatalf("fed from another session: %q, want %q", got, want)
	}
	if n := len(must(src.Tokens())); n != len(prompt)+5 {
		t.Fatalf("the source session changed: %d tokens", n)
	}
	check := func(err error, code Code, part string) {
		t.Helper()
		var e *Error
		if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, part) {
			t.Fatalf("want %v containing %q, got %v", code, part, err)
		}
	}
	check(s.FeedFrom(src, 1), StateError, "text already")
	noErr(t, s.Reset())
	check(s.FeedFrom(src, len(prompt)+6), InvalidArgument, "n_tokens")
	check(s.FeedFrom(src, -1), InvalidArgument, "negative")
	check(s.FeedFrom(nil, 1), InvalidArgument, "closed")
}
