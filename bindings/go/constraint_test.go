package specinfer

import (
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
)

// Structured output and log-probabilities on a kgram byte model (no model files needed).

const constraintPrompt = "the "

// letters is the grammar the constraint tests use: two letters a..e, then the text ends.
var letters = regexp.MustCompile(`^[a-e][a-e]$`)

// openLetters opens the [a-e][a-e] regex constraint on target, skipping the test when the
// llguidance plugin is not installed.
func openLetters(t *testing.T, r *Registry, target *Target) *Constraint {
	t.Helper()
	c, err := r.OpenConstraint("llguidance", "", target, "regex", "[a-e][a-e]")
	var e *Error
	if errors.As(err, &e) && e.Code == NotFound {
		t.Skipf("no llguidance plugin: %v", err)
	}
	noErr(t, err)
	return c
}

// constrained generates after constraintPrompt with c set, one Step at a time until the text
// ends, and returns the text.
func constrained(t *testing.T, tg *Target, d *DrafterHandle, c *Constraint, p SessionParams) string {
	t.Helper()
	s := must(NewSession(tg, d, nil, p))
	defer s.Close()
	noErr(t, s.SetConstraint(c))
	noErr(t, s.FeedText(constraintPrompt))
	var text strings.Builder
	for rounds := 0; ; rounds++ {
		if rounds > 10 {
			t.Fatalf("the constrained text did not end: %q", text.String())
		}
		_, done, err := s.Step(16)
		noErr(t, err)
		text.WriteString(must(s.StepText()))
		if done {
			break
		}
	}
	// The grammar has ended: a further round is refused until the session is fed again.
	var e *Error
	if _, _, err := s.Step(16); !errors.As(err, &e) || e.Code != StateError {
		t.Fatalf("a round after the grammar's end: %v", err)
	}
	return text.String()
}

func TestConstraintMakesTheTextMatchItsGrammar(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := kgram(t, r, 3)
	defer tg.Close()
	c := openLetters(t, r, tg)
	defer c.Close()
	check := func(err error, code Code, part string) {
		t.Helper()
		var e *Error
		if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, part) {
			t.Fatalf("want %v containing %q, got %v", code, part, err)
		}
	}
	_, err := r.OpenConstraint("llguidance", "", tg, "regex", "(unclosed")
	check(err, InvalidArgument, "does not compile")

	// Greedy, then sampled with several seeds, with and without a drafter: the same constraint
	// serves one session after another.
	greedy := constrained(t, tg, nil, c, DefaultSessionParams())
	if !letters.MatchString(greedy) {
		t.Fatalf("greedy constrained text %q", greedy)
	}
	d := must(r.OpenDrafter("ngram", "", tg))
	defer d.Close()
	if got := constrained(t, tg, d, c, DefaultSessionParams()); got != greedy {
		t.Fatalf("with a drafter: %q, without: %q", got, greedy)
	}
	sampled := map[string]bool{}
	for seed := range uint64(12) {
		p := DefaultSessionParams()
		p.Temperature, p.Seed = 1, seed
		var dh *DrafterHandle
		if seed%2 == 1 {
			dh = d
		}
		text := constrained(t, tg, dh, c, p)
		if !letters.MatchString(text) {
			t.Fatalf("seed %d: sampled constrained text %q", seed, text)
		}
		sampled[text] = true
	}
	if len(sampled) < 2 { // fixed seeds: the same texts on every run
		t.Fatalf("12 seeds sampled one text: %v", sampled)
	}

	// In use: Close is refused with the library's code, and so is a second session.
	share := must(tg.Share())
	defer share.Close()
	s := must(NewSession(tg, nil, nil, DefaultSessionParams()))
	noErr(t, s.SetConstraint(c))
	check(c.Close(), StateError, "used by a session")
	other := must(NewSession(share, nil, nil, DefaultSessionParams()))
	check(other.SetConstraint(c), StateError, "already used")
	// A fork serves the other session (a target sharing the model) with the same grammar.
	f := must(c.Fork())
	noErr(t, other.SetConstraint(f))
	noErr(t, other.FeedText(constraintPrompt))
	if text := must(other.Generate(16)); text != greedy {
		t.Fatalf("forked constraint: %q, want %q", text, greedy)
	}
	if st := must(other.Stats()); st.NGenerated != 2 {
		t.Fatalf("stats of the constrained session: %+v", st)
	}
	noErr(t, other.Close())
	noErr(t, f.Close())
	// Cleared, the session generates unconstrained text again, and c may be closed.
	noErr(t, s.SetConstraint(nil))
	noErr(t, s.FeedText(constraintPrompt))
	must(s.Generate(16))
	if n := len(must(s.Tokens())); n != len(constraintPrompt)+16 {
		t.Fatalf("unconstrained: %d tokens", n)
	}
	noErr(t, c.Close())
	noErr(t, c.Close()) // twice: a no-op
	check(s.SetConstraint(c), InvalidArgument, "closed")
	noErr(t, s.Close())
}

func TestStepLogprobsDescribeEachEmittedToken(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := kgram(t, r, 6)
	defer tg.Close()
	d := must(r.OpenDrafter("ngram", "", tg))
	defer d.Close()
	s := must(NewSession(tg, d, nil, sharedParams()))
	defer s.Close()
	var e *Error
	if err := s.SetLogprobs(MaxTopLogprobs + 1); !errors.As(err, &e) || e.Code != InvalidArgument {
		t.Fatalf("SetLogprobs(%d): %v", MaxTopLogprobs+1, err)
	}
	if err := s.SetLogprobs(1 << 40); !errors.As(err, &e) || e.Code != InvalidArgument {
		t.Fatalf("SetLogprobs(1 << 40): %v", err)
	}
	noErr(t, s.SetLogprobs(2))
	noErr(t, s.FeedText(prompt))
	emitted := 0
	for round := 0; emitted < 80; round++ {
		toks, _, err := s.Step(80 - emitted)
		noErr(t, err)
		emitted += len(toks)
		lps := must(s.StepLogprobs())
		if len(lps) != len(toks) {
			t.Fatalf("round %d: %d tokens, %d log-probabilities", round, len(toks), len(lps))
		}
		for i, lp := range lps {
			if lp.Token != toks[i] || len(lp.Top) != 2 || lp.Logprob > 0 || math.IsNaN(float64(lp.Logprob)) {
				t.Fatalf("round %d, token %d (%d): %+v", round, i, toks[i], lp)
			}
			if lp.Top[0].Logprob < lp.Top[1].Logprob || lp.Top[0].Logprob > 0 || lp.Top[1].Logprob > 0 {
				t.Fatalf("round %d, token %d: alternatives %+v", round, i, lp.Top)
			}
			for _, alt := range lp.Top {
				if alt.Token == lp.Token && math.Abs(float64(alt.Logprob-lp.Logprob)) > 1e-4 {
					t.Fatalf("round %d: token %d has log-probability %g, %g among the alternatives",
						round, lp.Token, lp.Logprob, alt.Logprob)
				}
			}
			// Greedy: the emitted token is the most likely one.
			if math.Abs(float64(lp.Logprob-lp.Top[0].Logprob)) > 1e-4 {
				t.Fatalf("round %d: greedy token %+v is not the most likely", round, lp)
			}
		}
	}
	// Off again: the next round has none.
	noErr(t, s.SetLogprobs(-1))
	_, _, err := s.Step(8)
	noErr(t, err)
	if lps := must(s.StepLogprobs()); len(lps) != 0 {
		t.Fatalf("log-probabilities while off: %+v", lps)
	}
}

func TestPromptLogprobsCoverThePrompt(t *testing.T) {
	r := must(NewRegistry(2))
	defer r.Close()
	tg := kgram(t, r, 6)
	defer tg.Close()
	s := must(NewSession(tg, nil, nil, sharedParams()))
	defer s.Close()
	var e *Error
	if err := s.SetPromptLogprobs(MaxTopLogprobs + 1); !errors.As(err, &e) || e.Code != InvalidArgument {
		t.Fatalf("SetPromptLogprobs(%d): %v", MaxTopLogprobs+1, err)
	}
	noErr(t, s.SetPromptLogprobs(2))
	noErr(t, s.FeedText(prompt))
	_, _, err := s.Step(4)
	noErr(t, err)
	st := must(s.Stats())
	text := must(s.Tokens())
	lps := must(s.PromptLogprobs())
	if int64(len(lps)) != st.NPromptTokens-1 {
		t.Fatalf("%d prompt tokens, %d log-probabilities", st.NPromptTokens, len(lps))
	}
	for i, lp := range lps {
		if lp.Token != text[i+1] || len(lp.Top) != 2 || lp.Logprob > 0 || lp.Top[0].Logprob < lp.Logprob-1e-4 {
			t.Fatalf("prompt token %d: %+v", i+1, lp)
		}
	}
}
