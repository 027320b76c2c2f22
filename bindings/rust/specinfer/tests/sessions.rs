//! Real sessions on the kgram target (trained on abi/specinfer.h) through the safe bindings.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{corpus, generate, kgram, plain_and_spec, Lookup, PlainAndSpec, Probe, PROMPT};
use specinfer::plugin::{Draft, DraftRequest, Drafter};
use specinfer::{Code, Coupler, Error, ModelInfo, Registry, Session, SessionParams, Sketcher};

fn registry() -> Registry {
    Registry::with_threads(2).expect("registry")
}

#[test]
fn ngram_drafter_gives_the_plain_greedy_text() {
    let reg = registry();
    let coupler = Coupler::new("greedy").unwrap();
    let PlainAndSpec { plain, plain_stats: st0, spec, stats: st } =
        plain_and_spec(&reg, "ngram", "n_max=4", Some(&coupler), 300);
    assert_eq!(st0.n_drafted, 0);
    assert_eq!(st0.n_generated, 300);
    assert_eq!(spec, plain);
    assert!(!plain.is_empty());
    assert!(st.n_accepted > 0, "{st:?}");
    assert!(st.n_target_passes < st0.n_target_passes, "{st:?} vs {st0:?}");
}

#[test]
fn rust_drafter_gives_the_plain_greedy_text() {
    let reg = registry();
    let begins = Arc::new(AtomicUsize::new(0));
    let b = begins.clone();
    reg.register_drafter("lookup-rs", "prompt lookup in Rust", move |cfg: &str, info: &ModelInfo| {
        if !cfg.is_empty() {
            return Err(Error::new(Code::Config, format!("lookup-rs takes no config, got '{cfg}'")));
        }
        assert_eq!(info.vocab_size, 256);
        Ok(Box::new(Lookup { n_max: 3, begins: b.clone() }) as Box<dyn Drafter>)
    })
    .unwrap();
    let info = reg.plugins().unwrap().into_iter().find(|p| p.name == "lookup-rs").unwrap();
    assert!(info.has_drafter && !info.has_target && info.path.is_empty());

    for coupler in ["greedy", "gumbel"] {
        let coupler = Coupler::new(coupler).unwrap();
        let before = begins.load(Ordering::SeqCst);
        let run = plain_and_spec(&reg, "lookup-rs", "", Some(&coupler), 300);
        assert_eq!(run.spec, run.plain, "coupler {}", coupler.name());
        assert!(run.stats.n_accepted > 0, "{:?}", run.stats);
        assert_eq!(begins.load(Ordering::SeqCst), before + 1);
    }
    // The factory's refusal reaches the caller with its code and message.
    let target = kgram(&reg, 6);
    let e = reg.open_drafter("lookup-rs", "x=1", &target).err().unwrap();
    assert_eq!(e.code(), Code::Config);
    assert!(e.message().contains("lookup-rs takes no config, got 'x=1'"), "{e}");
    // A second registration under the same name is refused.
    let e = reg
        .register_drafter("lookup-rs", "", |_: &str, _: &ModelInfo| Err(Error::new(Code::Internal, "never")))
        .unwrap_err();
    assert_eq!(e.code(), Code::State);
}

#[test]
fn rust_drafter_sees_no_hidden_state_and_the_pass_costs_with_kgram() {
    let reg = registry();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    reg.register_drafter("probe-rs", "", move |_: &str, _: &ModelInfo| {
        Ok(Box::new(Probe { seen: s.clone(), lookup: Lookup { n_max: 3, begins: Default::default() } })
            as Box<dyn Drafter>)
    })
    .unwrap();
    let PlainAndSpec { plain, spec, stats: st, .. } = plain_and_spec(&reg, "probe-rs", "", None, 200);
    assert_eq!(spec, plain);
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty() && st.n_drafted > 0);
    for (hidden, position, cost, _, max_tokens) in seen.iter() {
        // kgram has no hidden state (hidden_size 0).
        assert_eq!(*hidden, None);
        assert_eq!(*position, -1);
        assert_eq!(cost.len(), max_tokens + 1, "{cost:?}");
        assert_eq!(cost[0], 1.0, "{cost:?}");
        assert!(cost.iter().all(|c| c.is_finite() && *c > 0.0), "{cost:?}");
    }
}

struct Failing {
    panic: bool,
}
impl Drafter for Failing {
    fn propose(&mut self, _: &DraftRequest<'_>, _: &mut Draft<'_>) -> specinfer::Result<()> {
        if self.panic {
            panic!("drafter bug 7");
        }
        Err(Error::new(Code::Plugin, "the oracle is out of tea"))
    }
}

#[test]
fn drafter_errors_and_panics_reach_the_caller() {
    let reg = registry();
    reg.register_drafter("failing-rs", "", |cfg: &str, _: &ModelInfo| {
        Ok(Box::new(Failing { panic: cfg == "panic=1" }) as Box<dyn Drafter>)
    })
    .unwrap();
    let mut target = kgram(&reg, 4);
    for (cfg, want) in [("", "the oracle is out of tea"), ("panic=1", "drafter bug 7")] {
        let mut d = reg.open_drafter("failing-rs", cfg, &target).unwrap();
        let mut s = Session::new(&mut target, Some(&mut d), None, &SessionParams::default()).unwrap();
        s.feed_text(PROMPT).unwrap();
        let e = s.generate(20).unwrap_err();
        assert_eq!(e.code(), Code::Plugin, "{e}");
        assert!(e.message().contains(want), "{e}");
    }
}

#[test]
fn draft_rejects_bad_tokens() {
    struct Bad;
    impl Drafter for Bad {
        fn propose(&mut self, _: &DraftRequest<'_>, d: &mut Draft<'_>) -> specinfer::Result<()> {
            d.push(100_000)
        }
    }
    let reg = registry();
    reg.register_drafter("bad-rs", "", |_: &str, _: &ModelInfo| Ok(Box::new(Bad) as Box<dyn Drafter>)).unwrap();
    let mut target = kgram(&reg, 4);
    let mut d = reg.open_drafter("bad-rs", "", &target).unwrap();
    let mut s = Session::new(&mut target, Some(&mut d), None, &SessionParams::default()).unwrap();
    s.feed_text(PROMPT).unwrap();
    let e = s.generate(20).unwrap_err();
    assert!(e.message().contains("outside the vocabulary"), "{e}");
}

#[test]
fn rust_drafter_reports_the_accepted_length_it_expects() {
    // Prompt lookup that expects the target to keep half of each draft, and sums what it said.
    struct Expecting {
        lookup: Lookup,
        said: Arc<std::sync::Mutex<(f64, i64)>>,
    }
    impl Drafter for Expecting {
        fn propose(&mut self, req: &DraftRequest<'_>, d: &mut Draft<'_>) -> specinfer::Result<()> {
            self.lookup.propose(req, d)?;
            if !d.is_empty() {
                let half = d.len() as f64 / 2.0;
                let mut said = self.said.lock().unwrap();
                said.0 += half;
                said.1 += 1;
                d.set_expected_accepted(half)?;
            }
            Ok(())
        }
    }
    let reg = registry();
    let said = Arc::new(std::sync::Mutex::new((0.0, 0i64)));
    let s2 = said.clone();
    reg.register_drafter("expecting-rs", "", move |_: &str, _: &ModelInfo| {
        let lookup = Lookup { n_max: 3, begins: Arc::new(AtomicUsize::new(0)) };
        Ok(Box::new(Expecting { lookup, said: s2.clone() }) as Box<dyn Drafter>)
    })
    .unwrap();
    let PlainAndSpec { plain, spec, stats: st, .. } = plain_and_spec(&reg, "expecting-rs", "", None, 200);
    assert_eq!(spec, plain);
    let (sum, rounds) = *said.lock().unwrap();
    assert!(rounds > 0 && st.n_estimated_rounds == rounds, "{rounds}: {st:?}");
    assert!((st.expected_accepted - sum).abs() < 1e-9, "{sum}: {st:?}");
    assert!(st.estimated_rounds_accepted > 0.0 && st.estimated_rounds_accepted <= st.n_accepted as f64, "{st:?}");

    // More than its tokens is refused, saying so.
    struct Greedy;
    impl Drafter for Greedy {
        fn propose(&mut self, _: &DraftRequest<'_>, d: &mut Draft<'_>) -> specinfer::Result<()> {
            d.push(1)?;
            d.push(2)?;
            d.set_expected_accepted(3.0)
        }
    }
    reg.register_drafter("greedy-rs", "", |_: &str, _: &ModelInfo| Ok(Box::new(Greedy) as Box<dyn Drafter>)).unwrap();
    let mut target = kgram(&reg, 6);
    let mut d = reg.open_drafter("greedy-rs", "", &target).unwrap();
    let mut s = Session::new(&mut target, Some(&mut d), None, &SessionParams::default()).unwrap();
    s.feed_text(PROMPT).unwrap();
    let e = s.generate(20).unwrap_err();
    assert!(e.message().contains("expects 3 accepted tokens, not within 0..2"), "{e}");
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let reg = registry();
    let mut target = kgram(&reg, 6);
    let (whole, _) = generate(&mut target, None, None, 120);
    let stop = &whole[40..46];
    let cut = whole.find(stop).unwrap();
    let mut drafter = reg.open_drafter("ngram", "", &target).unwrap();
    let mut s =
        Session::new(&mut target, Some(&mut drafter), None, &SessionParams { max_draft: 6, ..Default::default() })
            .unwrap();
    s.set_stop_strings(&[stop, "\u{1}never"]).unwrap();
    s.feed_text(PROMPT).unwrap();
    let text: String = s.stream(120).map(|c| c.unwrap()).collect();
    assert_eq!(text, whole[..cut]);
    let st = s.stats().unwrap();
    assert_eq!(s.tokens().unwrap().len() as i64, st.n_prompt_tokens + (cut + stop.len()) as i64);
    // Held back while it may begin a stop string; end_text releases it at the caller's budget.
    s.reset().unwrap();
    let held = whole[29..30].to_string() + "\u{1}";
    s.set_stop_strings(&[held.as_str()]).unwrap();
    s.feed_text(PROMPT).unwrap();
    let mut text = String::new();
    for _ in 0..30 {
        let (toks, done) = s.step(1).unwrap();
        assert_eq!(toks.len(), 1);
        assert!(!done);
        text.push_str(&s.step_text().unwrap());
    }
    assert_eq!(text, whole[..29]);
    assert_eq!(s.end_text().unwrap(), whole[29..30]);
    let e = s.set_stop_strings(&["a\0b"]).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let many = vec!["x"; 65];
    let e = s.set_stop_strings(&many).unwrap_err();
    assert!(e.message().contains("at most 64"), "{e}");
    assert_eq!(s.step(0).unwrap_err().code(), Code::BufferTooSmall);
}

#[test]
fn stream_yields_the_generated_text() {
    let reg = registry();
    let mut target = kgram(&reg, 6);
    let (whole, _) = generate(&mut target, None, None, 120);
    let mut drafter = reg.open_drafter("ngram", "", &target).unwrap();
    let mut s =
        Session::new(&mut target, Some(&mut drafter), None, &SessionParams { max_draft: 6, ..Default::default() })
            .unwrap();
    s.feed_text(PROMPT).unwrap();
    let chunks: Vec<String> = s.stream(120).collect::<Result<_, _>>().unwrap();
    assert!(chunks.len() > 1);
    assert_eq!(chunks.concat(), whole);
    let st = s.stats().unwrap();
    assert_eq!(st.n_generated, 120);
    assert_eq!(chunks.len() as i64, st.n_rounds);
    let toks = s.tokens().unwrap();
    assert_eq!(toks.len() as i64, st.n_prompt_tokens + 120);
    // reset, then stream again: the same text.
    s.reset().unwrap();
    s.feed_text(PROMPT).unwrap();
    let again: String = s.stream(120).map(|c| c.unwrap()).collect();
    assert_eq!(again, whole);
}

#[test]
fn step_and_tokenize() {
    let reg = registry();
    let mut target = kgram(&reg, 5);
    let info = target.info().unwrap();
    assert_eq!(info.vocab_size, 256);
    assert_eq!(info.arch, "kgram");
    let ids = target.tokenize("héllo", false, false).unwrap();
    assert_eq!(ids.len(), 6);
    assert_eq!(target.detokenize(&ids).unwrap(), "héllo".as_bytes());
    let e = target.detokenize(&[300]).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(!e.message().is_empty());
    let mut s = Session::new(&mut target, None, None, &SessionParams::default()).unwrap();
    s.feed_tokens(&ids).unwrap();
    let (toks, done) = s.step(8).unwrap();
    assert_eq!(toks.len(), 1);
    assert!(!done);
}

#[test]
fn bad_input_becomes_errors_with_the_library_message() {
    let reg = registry();
    let e = reg.open_target("no-such-plugin", "").err().unwrap();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("no-such-plugin"), "{e}");
    let e = reg.open_target("kgram", &format!("path={},bogus=3", corpus())).err().unwrap();
    assert_eq!(e.code(), Code::Config);
    assert!(e.message().contains("bogus"), "{e}");
    let e = reg.open_target("kgram", "path=/no/such/file").err().unwrap();
    // (The kgram plugin reports a missing training file as a plugin failure.)
    assert!(matches!(e.code(), Code::NotFound | Code::Io | Code::Plugin), "{e}");
    assert!(e.message().contains("/no/such/file"), "{e}");
    let e = reg.open_target("kgram", "a\0b").err().unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = Coupler::new("lenient:7").err().unwrap();
    assert_eq!(e.code(), Code::Config);
    assert_eq!(e.code().name(), "SPECINFER_ERR_CONFIG");
    assert!(e.to_string().starts_with("SPECINFER_ERR_CONFIG: "), "{e}");

    let mut target = kgram(&reg, 4);
    let e = Session::new(&mut target, None, None, &SessionParams { temperature: -1.0, ..Default::default() })
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("temperature"), "{e}");
    let mut s = Session::new(&mut target, None, None, &SessionParams::default()).unwrap();
    let e = s.generate(10).unwrap_err();
    assert_eq!(e.code(), Code::State);
    assert!(e.message().contains("feed"), "{e}");
    let e = s.feed_tokens(&[7, 999]).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // A stopping callback gives CANCELLED.
    s.feed_text(PROMPT).unwrap();
    let e = s.generate_with(50, |_, _| false).unwrap_err();
    assert_eq!(e.code(), Code::Cancelled);
}

#[test]
fn coupler_verifies_and_refuses_bad_rows() {
    let c = Coupler::new("rejection").unwrap();
    assert!(c.is_exact());
    assert_eq!(c.name(), "rejection");
    // vocab 2: the target puts all mass on token 1; drafting token 1 is accepted.
    let p = [0.0, 1.0, 0.0, 1.0];
    let v = c.verify(2, &p, None, &[1], 7, 3).unwrap();
    assert_eq!(v.n_accepted, 1);
    assert_eq!(v.token, 1);
    let v = c.verify(2, &p, None, &[0], 7, 3).unwrap();
    assert_eq!(v.n_accepted, 0);
    assert_eq!(v.token, 1);
    let e = c.verify(2, &[0.5, 0.7, 0.0, 1.0], None, &[1], 7, 3).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(!e.message().is_empty());
    let g = Coupler::new("greedy").unwrap();
    assert_eq!(g.draft_sample(&[0.2, 0.5, 0.3], 1, 0).unwrap(), 1);
}

#[test]
fn sketcher_estimates_inner_products() {
    let s = Sketcher::new("jl", 64, 512, 42, "").unwrap();
    let a: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() + 0.1).collect();
    let exact: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
    let (sa, sb) = (s.sketch(&a, false).unwrap(), s.sketch(&b, false).unwrap());
    assert_eq!(sa.len(), s.info().unwrap().key_bytes);
    let est = s.estimate(&sa, &sb).unwrap();
    // Standard deviation about sqrt(2/512) * |a||b| ~ 2; allow 4 sigma.
    assert!((est - exact).abs() < 8.0, "{est} vs {exact}");
    assert_eq!(s.sketch(&a, false).unwrap(), sa, "deterministic");
    let h = Sketcher::read_header(&sa).unwrap();
    assert_eq!((h.kind.as_str(), h.dim, h.size), ("jl", 64, 512));
    let e = s.estimate(&sa[..10], &sb).unwrap_err();
    assert_eq!(e.code(), Code::Format);
    let e = s.sketch(&a[..3], false).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = Sketcher::new("nope", 4, 4, 0, "").err().unwrap();
    assert_eq!(e.code(), Code::Config);
}

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}

#[test]
fn handles_move_between_threads() {
    assert_send::<Registry>();
    assert_sync::<Registry>();
    assert_send::<specinfer::Target>();
    assert_send::<specinfer::Drafter>();
    assert_send::<Session<'static>>();
    assert_sync::<Coupler>();
    assert_sync::<Sketcher>();
    let reg = registry();
    let coupler = Coupler::new("greedy").unwrap();
    let mut target = kgram(&reg, 6);
    let (plain, _) = generate(&mut target, None, None, 80);
    // Two sessions on two targets in two threads, sharing the registry and the coupler.
    let mut t2 = kgram(&reg, 6);
    let texts: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = [&mut target, &mut t2]
            .into_iter()
            .map(|t| {
                let reg = reg.clone();
                let coupler = &coupler;
                sc.spawn(move || {
                    let mut d = reg.open_drafter("ngram", "", t).unwrap();
                    generate(t, Some(&mut d), Some(coupler), 80).0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(texts, vec![plain.clone(), plain]);
}

#[test]
fn context_shift_goes_on_past_a_full_window() {
    let reg = registry();
    let mut target = reg.open_target("kgram", &format!("path={},k=4,n_ctx=64", corpus())).unwrap();
    {
        let mut s = Session::new(&mut target, None, None, &SessionParams::default()).unwrap();
        s.feed_text(PROMPT).unwrap();
        assert_eq!(s.generate(200).unwrap_err().code(), Code::ContextFull);
    }
    let params = SessionParams { context_shift: true, n_keep: 8, ..Default::default() };
    let mut s = Session::new(&mut target, None, None, &params).unwrap();
    s.feed_text(PROMPT).unwrap();
    s.generate(200).unwrap();
    let st = s.stats().unwrap();
    assert_eq!(st.n_generated, 200);
    assert!(st.n_context_shifts >= 3, "{st:?}");
    assert!(s.tokens().unwrap().len() <= 64);
}
