//! One loaded model, many users: targets shared from one kgram target run sessions on several
//! threads at once, and `Session::step_many` steps several sessions together; every text equals
//! the one a lone session gives.

mod common;

use common::{kgram, PROMPT};
use specinfer::{Code, Coupler, Registry, Session, SessionParams, Step, StepParams, Target};

const PROMPTS: [&str; 3] = [PROMPT, "typedef struct specinfer_", "/* Runs one round of each"];

fn params() -> SessionParams {
    SessionParams { max_draft: 6, ..SessionParams::default() }
}

/// The first `n` tokens a lone session on its own target generates after `prompt` (greedy).
fn lone(reg: &Registry, prompt: &str, n: i32, drafter: bool) -> Vec<i32> {
    let mut t = kgram(reg, 6);
    let mut d = reg.open_drafter("ngram", "", &t).unwrap();
    let mut s = Session::new(&mut t, if drafter { Some(&mut d) } else { None }, None, &params()).unwrap();
    s.feed_text(prompt).unwrap();
    s.generate(n).unwrap();
    s.tokens().unwrap()[prompt.len()..].to_vec()
}

#[test]
fn shared_targets_run_sessions_on_threads() {
    let reg = Registry::with_threads(2).unwrap();
    let coupler = Coupler::new("greedy").unwrap();
    let root = kgram(&reg, 6);
    let shares: Vec<Target> = (0..4).map(|_| root.share().unwrap()).collect();
    assert_eq!(shares[0].info().unwrap(), root.info().unwrap());
    // The first target may go before its shares: they keep the model.
    drop(root);
    let want: Vec<Vec<i32>> = (0..4).map(|i| lone(&reg, PROMPTS[i % 3], 120, i % 2 == 0)).collect();
    let got: Vec<Vec<i32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = shares
            .into_iter()
            .enumerate()
            .map(|(i, mut t)| {
                let (reg, coupler) = (reg.clone(), &coupler);
                sc.spawn(move || {
                    let mut d = reg.open_drafter("ngram", "", &t).unwrap();
                    let drafter = if i % 2 == 0 { Some(&mut d) } else { None };
                    let mut s = Session::new(&mut t, drafter, Some(coupler), &params()).unwrap();
                    let prompt = PROMPTS[i % 3];
                    s.feed_text(prompt).unwrap();
                    // Many rounds each, so the threads' passes overlap.
                    s.generate(120).unwrap();
                    s.tokens().unwrap()[prompt.len()..].to_vec()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    assert!(got.iter().all(|t| t.len() == 120));
}

#[test]
fn step_many_equals_lone_sessions() {
    let reg = Registry::with_threads(2).unwrap();
    const N: usize = 100;
    let want: Vec<Vec<i32>> = (0..3).map(|i| lone(&reg, PROMPTS[i], N as i32, i != 1)).collect();
    let root = kgram(&reg, 6);
    let mut targets: Vec<Target> = (0..3).map(|_| root.share().unwrap()).collect();
    let mut drafters: Vec<_> = targets.iter().map(|t| reg.open_drafter("ngram", "", t).unwrap()).collect();
    for chunk in [0, 4] {
        let mut sessions: Vec<Session> = targets
            .iter_mut()
            .zip(drafters.iter_mut())
            .enumerate()
            .map(|(i, (t, d))| {
                let mut s = Session::new(t, if i != 1 { Some(d) } else { None }, None, &params()).unwrap();
                s.feed_text(PROMPTS[i]).unwrap();
                s
            })
            .collect();
        let mut got: Vec<Vec<i32>> = vec![Vec::new(); 3];
        let mut texts: Vec<String> = vec![String::new(); 3];
        let mut calls = 0;
        while got.iter().any(|g| g.len() < N) {
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            let steps = Session::step_many_with(&mut refs, &StepParams { prefill_chunk: chunk }).unwrap();
            for ((g, text), st) in got.iter_mut().zip(texts.iter_mut()).zip(steps) {
                let Step { tokens, done, text: round } = st.unwrap();
                assert!(!done, "kgram has no end-of-generation token");
                g.extend(tokens);
                text.push_str(&round);
            }
            calls += 1;
            assert!(calls < 10 * N, "step_many makes no progress");
        }
        // kgram's tokens are bytes: each round's text is its tokens' bytes.
        for (g, text) in got.iter().zip(&texts) {
            let bytes: Vec<u8> = g.iter().map(|t| *t as u8).collect();
            assert_eq!(text.as_bytes(), &bytes[..], "prefill_chunk {chunk}");
        }
        for (g, w) in got.iter_mut().zip(&want) {
            g.truncate(N);
            assert_eq!(g, w, "prefill_chunk {chunk}");
        }
    }
    drop(root);
}

#[test]
fn step_many_errors_are_per_session() {
    let reg = Registry::with_threads(1).unwrap();
    let root = kgram(&reg, 4);
    let (mut a, mut b) = (root.share().unwrap(), root.share().unwrap());
    let mut sa = Session::new(&mut a, None, None, &params()).unwrap();
    let mut sb = Session::new(&mut b, None, None, &params()).unwrap();
    sa.feed_text(PROMPT).unwrap();
    // sb has no prompt: its round fails with the library's code and message; sa's runs.
    let steps = Session::step_many_with(&mut [&mut sa, &mut sb], &StepParams { prefill_chunk: 0 }).unwrap();
    assert_eq!(steps.len(), 2);
    assert!(!steps[0].as_ref().unwrap().tokens.is_empty());
    let e = steps[1].as_ref().unwrap_err();
    assert_eq!(e.code(), Code::State, "{e}");
    assert!(e.message().contains("feed"), "{e}");
    // A call refused as a whole runs nothing.
    let before = sa.tokens().unwrap().len();
    let e = Session::step_many_with(&mut [&mut sa], &StepParams { prefill_chunk: -1 }).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert_eq!(sa.tokens().unwrap().len(), before);
    // No sessions: nothing to do.
    assert!(Session::step_many(&mut []).unwrap().is_empty());
    // Once the sessions are gone a target can be shared again, a share of a share too. (Sessions
    // stepped together have one lifetime: each target stays borrowed until all are dropped.)
    drop(sa);
    drop(sb);
    let c = a.share().unwrap();
    assert_eq!(c.info().unwrap().arch, "kgram");
}

#[test]
fn feed_from_continues_another_sessions_prompt() {
    // kgram cannot copy its cache: the prompt is scored again, and the text is the same.
    let reg = Registry::with_threads(2).unwrap();
    let want = lone(&reg, PROMPT, 40, false);
    let root = kgram(&reg, 6);
    let (mut a, mut b) = (root.share().unwrap(), root.share().unwrap());
    let mut src = Session::new(&mut a, None, None, &params()).unwrap();
    let mut s = Session::new(&mut b, None, None, &params()).unwrap();
    src.feed_text(PROMPT).unwrap();
    src.generate(5).unwrap();
    s.feed_from(&src, PROMPT.len()).unwrap();
    s.generate(40).unwrap();
    assert_eq!(s.tokens().unwrap()[PROMPT.len()..], want[..]);
    assert_eq!(src.tokens().unwrap().len(), PROMPT.len() + 5, "the source session changed");
    let e = s.feed_from(&src, 1).unwrap_err();
    assert_eq!(e.code(), Code::State, "{e}");
    assert!(e.message().contains("text already"), "{e}");
    s.reset().unwrap();
    let e = s.feed_from(&src, PROMPT.len() + 6).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("n_tokens"), "{e}");
}
