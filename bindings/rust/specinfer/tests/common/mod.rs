#![allow(dead_code)]
use specinfer::plugin::{Draft, DraftRequest, Drafter};
use specinfer::{Coupler, Registry, Result, Session, SessionParams, Target};

/// The training text of the kgram target: $SPECINFER_TEST_CORPUS, else abi/specinfer.h.
pub fn corpus() -> String {
    std::env::var("SPECINFER_TEST_CORPUS")
        .unwrap_or_else(|_| format!("{}/../../../abi/specinfer.h", env!("CARGO_MANIFEST_DIR")))
}

pub fn kgram(reg: &Registry, k: i32) -> Target {
    reg.open_target("kgram", &format!("path={},k={k}", corpus())).expect("open kgram")
}

pub const PROMPT: &str = "/* Creates a session that generates with";

/// Prompt lookup: finds the latest earlier occurrence of the context's last n tokens (n from
/// `n_max` down to 1) and proposes what followed it.
pub struct Lookup {
    pub n_max: usize,
    pub begins: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Drafter for Lookup {
    fn begin(&mut self, _context: &[i32]) -> Result<()> {
        self.begins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn propose(&mut self, req: &DraftRequest<'_>, draft: &mut Draft<'_>) -> Result<()> {
        let ctx = req.context();
        for n in (1..=self.n_max.min(ctx.len().saturating_sub(1))).rev() {
            let tail = &ctx[ctx.len() - n..];
            if let Some(start) = (0..ctx.len() - n).rev().find(|&s| &ctx[s..s + n] == tail) {
                for &t in ctx[start + n..].iter().take(req.max_tokens()) {
                    draft.push(t)?;
                }
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Greedy text of `max` tokens after PROMPT.
pub fn generate(
    target: &mut Target,
    drafter: Option<&mut specinfer::Drafter>,
    coupler: Option<&Coupler>,
    max: i32,
) -> (String, specinfer::Stats) {
    let mut s = Session::new(target, drafter, coupler, &SessionParams { max_draft: 6, ..Default::default() }).unwrap();
    s.feed_text(PROMPT).unwrap();
    let text = s.generate(max).unwrap();
    (text, s.stats().unwrap())
}
