//! Structured output and log-probabilities on a kgram byte model (no model files needed).
//! (That a constraint cannot be dropped, or set on a second session, while a session uses it is
//! checked at compile time: the `compile_fail` examples of `Constraint`.)

mod common;

use common::{kgram, PROMPT};
use specinfer::{Code, Constraint, Drafter, Registry, Session, SessionParams, Target, MAX_TOP_LOGPROBS};

const CONSTRAINT_PROMPT: &str = "the ";

fn registry() -> Registry {
    Registry::with_threads(2).expect("registry")
}

/// Two letters a..e, then the text ends: what the regex "[a-e][a-e]" allows.
fn two_letters(text: &str) -> bool {
    text.len() == 2 && text.bytes().all(|b| (b'a'..=b'e').contains(&b))
}

/// The [a-e][a-e] regex constraint on `target`; None, saying so, without the llguidance plugin.
fn open_letters(reg: &Registry, target: &Target) -> Option<Constraint> {
    match reg.open_constraint("llguidance", "", target, "regex", "[a-e][a-e]") {
        Ok(c) => Some(c),
        Err(e) if e.code() == Code::NotFound => {
            eprintln!("SKIPPED: no llguidance plugin ({e})");
            None
        }
        Err(e) => panic!("open the constraint: {e}"),
    }
}

/// Generates after CONSTRAINT_PROMPT with `constraint` set, one step at a time until the text
/// ends, and returns the text.
fn constrained(
    target: &mut Target,
    drafter: Option<&mut Drafter>,
    constraint: &mut Constraint,
    params: &SessionParams,
) -> String {
    let mut s = Session::new(target, drafter, None, params).unwrap();
    s.set_constraint(Some(constraint)).unwrap();
    s.feed_text(CONSTRAINT_PROMPT).unwrap();
    let mut text = String::new();
    for round in 0.. {
        assert!(round <= 10, "the constrained text did not end: {text:?}");
        let (_, done) = s.step(16).unwrap();
        text.push_str(&s.step_text().unwrap());
        if done {
            break;
        }
    }
    // The grammar has ended: a further round is refused until the session is fed again.
    assert_eq!(s.step(16).unwrap_err().code(), Code::State);
    text
}

#[test]
fn a_constraint_makes_the_text_match_its_grammar() {
    let reg = registry();
    let mut target = kgram(&reg, 3);
    let Some(mut c) = open_letters(&reg, &target) else { return };
    let e = reg.open_constraint("llguidance", "", &target, "regex", "(unclosed").err().unwrap();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("does not compile"), "{e}");

    // Greedy, then sampled with several seeds, with and without a drafter: the same constraint
    // serves one session after another.
    let greedy = constrained(&mut target, None, &mut c, &SessionParams::default());
    assert!(two_letters(&greedy), "greedy constrained text {greedy:?}");
    let mut d = reg.open_drafter("ngram", "", &target).unwrap();
    assert_eq!(constrained(&mut target, Some(&mut d), &mut c, &SessionParams::default()), greedy);
    let mut sampled = std::collections::BTreeSet::new();
    for seed in 0..12u64 {
        let params = SessionParams { temperature: 1.0, seed, ..Default::default() };
        let drafter = if seed % 2 == 1 { Some(&mut d) } else { None };
        let text = constrained(&mut target, drafter, &mut c, &params);
        assert!(two_letters(&text), "seed {seed}: sampled constrained text {text:?}");
        sampled.insert(text);
    }
    // Fixed seeds: the same texts on every run.
    assert!(sampled.len() >= 2, "12 seeds sampled one text: {sampled:?}");

    // A fork serves a session on a target sharing the model, with the same grammar, while the
    // original serves another.
    let mut share = target.share().unwrap();
    let mut f = c.fork().unwrap();
    {
        let mut a = Session::new(&mut target, None, None, &SessionParams::default()).unwrap();
        let mut b = Session::new(&mut share, None, None, &SessionParams::default()).unwrap();
        a.set_constraint(Some(&mut c)).unwrap();
        b.set_constraint(Some(&mut f)).unwrap();
        for s in [&mut a, &mut b] {
            s.feed_text(CONSTRAINT_PROMPT).unwrap();
            assert_eq!(s.generate(16).unwrap(), greedy);
            assert_eq!(s.stats().unwrap().n_generated, 2);
        }
        // Cleared, the session generates unconstrained text again.
        a.set_constraint(None).unwrap();
        a.feed_text(CONSTRAINT_PROMPT).unwrap();
        a.generate(16).unwrap();
        assert_eq!(a.tokens().unwrap().len(), 2 * CONSTRAINT_PROMPT.len() + 2 + 16);
    }
    // A constraint for another model's vocabulary is refused.
    let mut other = reg.open_target("kgram", &format!("path={},k=4", common::corpus())).unwrap();
    let mut s = Session::new(&mut other, None, None, &SessionParams::default()).unwrap();
    let e = s.set_constraint(Some(&mut f)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("another model"), "{e}");
}

#[test]
fn step_logprobs_describe_each_emitted_token() {
    let reg = registry();
    let mut target = kgram(&reg, 6);
    let mut d = reg.open_drafter("ngram", "", &target).unwrap();
    let mut s =
        Session::new(&mut target, Some(&mut d), None, &SessionParams { max_draft: 6, ..Default::default() }).unwrap();
    for bad in [MAX_TOP_LOGPROBS + 1, usize::MAX] {
        let e = s.set_logprobs(Some(bad)).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    }
    s.set_logprobs(Some(2)).unwrap();
    s.feed_text(PROMPT).unwrap();
    let (mut emitted, mut rounds) = (0, 0);
    while emitted < 80 {
        let (toks, _) = s.step(80 - emitted).unwrap();
        emitted += toks.len();
        rounds += 1;
        let lps = s.step_logprobs().unwrap();
        assert_eq!(lps.iter().map(|t| t.token).collect::<Vec<_>>(), toks, "round {rounds}");
        for t in &lps {
            assert_eq!(t.top.len(), 2, "{t:?}");
            assert!(t.logprob <= 0.0 && t.logprob.is_finite(), "{t:?}");
            assert!(t.top[0].1 >= t.top[1].1 && t.top[0].1 <= 0.0 && t.top[1].1 <= 0.0, "{t:?}");
            if let Some(&(_, lp)) = t.top.iter().find(|(id, _)| *id == t.token) {
                assert!((lp - t.logprob).abs() <= 1e-4, "{t:?}");
            }
            // Greedy: the emitted token is the most likely one.
            assert!((t.logprob - t.top[0].1).abs() <= 1e-4, "{t:?}");
        }
    }
    assert!(rounds < emitted, "the drafter kept nothing: {rounds} rounds for {emitted} tokens");
    // Off again: the next round has none.
    s.set_logprobs(None).unwrap();
    s.step(8).unwrap();
    assert!(s.step_logprobs().unwrap().is_empty());
}

#[test]
fn prompt_logprobs_cover_the_prompt() {
    let reg = registry();
    let mut target = kgram(&reg, 6);
    let mut s = Session::new(&mut target, None, None, &SessionParams::default()).unwrap();
    let e = s.set_prompt_logprobs(Some(MAX_TOP_LOGPROBS + 1)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    s.set_prompt_logprobs(Some(2)).unwrap();
    s.feed_text(PROMPT).unwrap();
    s.step(4).unwrap();
    let n_prompt = s.stats().unwrap().n_prompt_tokens as usize;
    let text = s.tokens().unwrap();
    let lps = s.prompt_logprobs().unwrap();
    assert_eq!(lps.len(), n_prompt - 1);
    for (i, t) in lps.iter().enumerate() {
        assert_eq!(t.token, text[i + 1]);
        assert!(t.top.len() == 2 && t.logprob <= 0.0 && t.top[0].1 >= t.logprob - 1e-4, "{t:?}");
    }
}
