//! A real model (Qwen2.5-Coder 0.5B, from scripts/fetch-models) with a Rust drafter, and Medusa
//! training on it. Skipped, saying so, when the file is absent ($SPECINFER_MODELS, default
//! ~/.cache/specinfer/models).

mod common;

use common::{corpus, Lookup, Probe};
use specinfer::plugin::Drafter;
use specinfer::{Code, ModelInfo, Registry, Session, SessionParams, TrainParams};

const PROMPT: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";

/// The model's path, or None (saying so) when the file is absent.
fn model() -> Option<String> {
    let dir = std::env::var("SPECINFER_MODELS")
        .unwrap_or_else(|_| format!("{}/.cache/specinfer/models", std::env::var("HOME").unwrap_or_default()));
    let model = format!("{dir}/qwen2.5-coder-0.5b.gguf");
    if !std::path::Path::new(&model).exists() {
        eprintln!("SKIPPED: {model} not found (scripts/fetch-models)");
        return None;
    }
    Some(model)
}

#[test]
fn rust_drafter_on_a_real_model_gives_the_plain_greedy_text() {
    let Some(model) = model() else { return };
    let reg = Registry::with_threads(2).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sn = seen.clone();
    reg.register_drafter("lookup-rs", "", move |_: &str, _: &ModelInfo| {
        Ok(Box::new(Probe { seen: sn.clone(), lookup: Lookup { n_max: 2, begins: Default::default() } })
            as Box<dyn Drafter>)
    })
    .unwrap();
    let mut target = reg.open_target("gguf", &format!("path={model}")).unwrap();
    let info = target.info().unwrap();
    assert_eq!(info.arch, "qwen2");
    // Qwen2.5's GGUF carries its chat template.
    assert!(info.chat_template.as_deref().is_some_and(|t| t.contains("<|im_start|>")));
    let params = SessionParams { max_draft: 4, ..Default::default() };
    let (plain, n0) = {
        let mut s = Session::new(&mut target, None, None, &params).unwrap();
        s.feed_text(PROMPT).unwrap();
        (s.stream(40).collect::<Result<String, _>>().unwrap(), s.stats().unwrap().n_generated)
    };
    let mut drafter = reg.open_drafter("lookup-rs", "", &target).unwrap();
    let mut s = Session::new(&mut target, Some(&mut drafter), None, &params).unwrap();
    s.feed_text(PROMPT).unwrap();
    let spec = s.stream(40).collect::<Result<String, _>>().unwrap();
    let st = s.stats().unwrap();
    assert_eq!(spec, plain);
    assert!(!plain.trim().is_empty());
    assert_eq!(st.n_generated, n0);
    assert!(st.n_drafted > 0);
    // The drafter gets the target's hidden state of the position that chose the last token.
    let seen = seen.lock().unwrap();
    assert!(seen.iter().any(|s| s.0.is_some()), "no request carried a hidden state");
    for (hidden, position, cost, n_context, max_tokens) in seen.iter() {
        if let Some(n) = hidden {
            assert_eq!(*n, info.hidden_size as usize);
            assert_eq!(*position, *n_context as i64 - 2);
        } else {
            assert_eq!(*position, -1);
        }
        assert_eq!(cost.len(), max_tokens + 1);
        assert_eq!(cost[0], 1.0);
    }
}

#[test]
fn medusa_training_on_a_real_model_stops_when_progress_says_so() {
    let Some(model) = model() else { return };
    let reg = Registry::with_threads(2).unwrap();
    let mut target = reg.open_target("gguf", &format!("path={model}")).unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("medusa-cancel");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("heads.gguf");
    let mut seen = Vec::new();
    let e = reg
        .train_drafter(
            "medusa",
            &mut target,
            TrainParams {
                corpus: vec![corpus().into()],
                out_path: out.clone(),
                progress: Some(Box::new(|p| {
                    seen.push((p.stage.to_string(), p.total));
                    false
                })),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.code(), Code::Cancelled, "{e}");
    assert!(seen.len() == 1 && seen[0].0 == "collect" && seen[0].1 > 0, "{seen:?}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
