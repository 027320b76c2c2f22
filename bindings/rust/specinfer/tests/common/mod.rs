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

/// What a drafter saw in one request: hidden state (length), its position, the pass costs, the
/// context length and max_tokens.
pub type Seen = (Option<usize>, i64, Vec<f32>, usize, usize);

/// Records what each request holds, then drafts by prompt lookup.
pub struct Probe {
    pub seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    pub lookup: Lookup,
}
impl Drafter for Probe {
    fn propose(&mut self, req: &DraftRequest<'_>, draft: &mut Draft<'_>) -> specinfer::Result<()> {
        self.seen.lock().unwrap().push((
            req.hidden().map(|h| h.len()),
            req.hidden_position(),
            req.pass_cost().to_vec(),
            req.context().len(),
            req.max_tokens(),
        ));
        self.lookup.propose(req, draft)
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

/// Plain and speculative decoding of the same text (`plain_and_spec`).
pub struct PlainAndSpec {
    pub plain: String,
    pub plain_stats: specinfer::Stats,
    pub spec: String,
    pub stats: specinfer::Stats,
}

/// `max` tokens after PROMPT on a 6-gram kgram target, plain and then with drafter `name` (opened
/// with `config`) and `coupler` (None: greedy).
pub fn plain_and_spec(reg: &Registry, name: &str, config: &str, coupler: Option<&Coupler>, max: i32) -> PlainAndSpec {
    let mut target = kgram(reg, 6);
    let (plain, plain_stats) = generate(&mut target, None, None, max);
    let mut drafter = reg.open_drafter(name, config, &target).expect("open the drafter");
    let (spec, stats) = generate(&mut target, Some(&mut drafter), coupler, max);
    PlainAndSpec { plain, plain_stats, spec, stats }
}

/// Compiles bindings/testdata/train_probe.c (a drafter plugin whose training only reports
/// progress and writes down its parameters) once per test binary and returns the plugin's path;
/// None, saying why, when there is no C compiler.
pub fn train_probe_plugin() -> Option<std::path::PathBuf> {
    static PLUGIN: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let src = format!("{}/../../testdata/train_probe.c", env!("CARGO_MANIFEST_DIR"));
            let include = option_env!("SPECINFER_INCLUDE_DIR").map(String::from).unwrap_or_else(|| {
                let out = std::process::Command::new("pkg-config")
                    .args(["--variable=includedir", "specinfer"])
                    .output()
                    .expect("pkg-config");
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            });
            let so = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("train-probe.so");
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
            match std::process::Command::new(&cc)
                .args(["-shared", "-fPIC", "-o"])
                .arg(&so)
                .arg(format!("-I{include}"))
                .arg(&src)
                .status()
            {
                Ok(st) if st.success() => Some(so),
                Ok(st) => panic!("{cc} could not compile {src}: {st}"),
                Err(e) => {
                    eprintln!("SKIPPED: no C compiler ({cc}: {e}) to build the train-probe plugin");
                    None
                }
            }
        })
        .clone()
}
