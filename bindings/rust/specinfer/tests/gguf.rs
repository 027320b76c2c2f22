//! A real model (Qwen2.5-Coder 0.5B, from scripts/fetch-models) with a Rust drafter. Skipped,
//! saying so, when the file is absent ($SPECINFER_MODELS, default ~/.cache/specinfer/models).

mod common;

use common::Lookup;
use specinfer::plugin::Drafter;
use specinfer::{ModelInfo, Registry, Session, SessionParams};

const PROMPT: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";

#[test]
fn rust_drafter_on_a_real_model_gives_the_plain_greedy_text() {
    let dir = std::env::var("SPECINFER_MODELS")
        .unwrap_or_else(|_| format!("{}/.cache/specinfer/models", std::env::var("HOME").unwrap_or_default()));
    let model = format!("{dir}/qwen2.5-coder-0.5b.gguf");
    if !std::path::Path::new(&model).exists() {
        eprintln!("SKIPPED: {model} not found (scripts/fetch-models)");
        return;
    }
    let reg = Registry::with_threads(2).unwrap();
    reg.register_drafter("lookup-rs", "", |_: &str, _: &ModelInfo| {
        Ok(Box::new(Lookup { n_max: 2, begins: Default::default() }) as Box<dyn Drafter>)
    })
    .unwrap();
    let mut target = reg.open_target("gguf", &format!("path={model}")).unwrap();
    let info = target.info().unwrap();
    assert_eq!(info.arch, "qwen2");
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
}
