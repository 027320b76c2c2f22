//! Training a drafter's weights for a target: Medusa heads (the `medusa` drafter) learn from
//! the target's own predictions on a text corpus.
//!
//! ```no_run
//! use specinfer::{Registry, TrainParams};
//! let registry = Registry::new()?;
//! let mut target = registry.open_target("gguf", "path=model.gguf")?;
//! registry.train_drafter(
//!     "medusa",
//!     &mut target,
//!     TrainParams {
//!         config: "heads=4,epochs=2".into(),
//!         corpus: vec!["train.txt".into()],
//!         out_path: "heads.gguf".into(),
//!         progress: Some(Box::new(|p| {
//!             eprintln!("{} {}/{} loss {:?}", p.stage, p.done, p.total, p.loss);
//!             true // false stops the training
//!         })),
//!     },
//! )?;
//! let drafter = registry.open_drafter("medusa", "path=heads.gguf", &target)?;
//! # Ok::<(), specinfer::Error>(())
//! ```

use std::ffi::{CStr, CString};
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr;

use specinfer_sys as sys;

use crate::error::{c_string, check_msg, Code, Error, Result};
use crate::{Registry, Target};

/// The progress callback: returns false to stop the training.
pub type ProgressFn<'a> = Box<dyn FnMut(&TrainProgress<'_>) -> bool + Send + 'a>;

/// What [`Registry::train_drafter`] trains from and where it writes. `Default` gives no config,
/// no corpus, no output path and no progress callback.
#[derive(Default)]
pub struct TrainParams<'a> {
    /// The drafter's own `key=value,...` training options ("" for its defaults).
    pub config: String,
    /// Text files to learn from (never the prompts an evaluation measures on).
    pub corpus: Vec<PathBuf>,
    /// The file to write; checkpoints are kept beside it.
    pub out_path: PathBuf,
    /// Called now and then, on one thread at a time (not necessarily the caller's); returning
    /// false stops the training, which then fails with [`Code::Cancelled`]. A panic in it stops
    /// the training too and resumes in the caller once the library has returned.
    pub progress: Option<ProgressFn<'a>>,
}

/// One report of a training's progress.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainProgress<'a> {
    /// "collect" (running the target over the corpus), "train" or "evaluate".
    pub stage: &'a str,
    /// Units of the stage done and in all (tokens, steps).
    pub done: i64,
    pub total: i64,
    /// Mean training loss over recent steps; None before the first.
    pub loss: Option<f64>,
    /// Per head, top-1 agreement with the target on held-out text; None before the first
    /// evaluation.
    pub accuracy: Option<&'a [f32]>,
}

struct ProgressState<'f, 'a> {
    f: &'f mut ProgressFn<'a>,
    panic: Option<Box<dyn std::any::Any + Send>>,
}

/// True when a progress report of `struct_size` bytes holds the field ending at `end`.
fn has(struct_size: u32, end: usize) -> bool {
    struct_size as usize >= end
}

unsafe extern "C" fn on_progress(user: *mut c_void, progress: *const sys::specinfer_train_progress) -> c_int {
    let state = &mut *(user as *mut ProgressState<'_, '_>);
    if state.panic.is_some() {
        return 1;
    }
    if progress.is_null() {
        return 0;
    }
    let raw = &*progress;
    type P = sys::specinfer_train_progress;
    let n = raw.struct_size;
    let stage = if has(n, offset_of!(P, stage) + size_of::<*const c_char>()) && !raw.stage.is_null() {
        CStr::from_ptr(raw.stage).to_string_lossy()
    } else {
        "".into()
    };
    let counts = has(n, offset_of!(P, total) + size_of::<i64>());
    let loss = if has(n, offset_of!(P, loss) + size_of::<f64>()) && !raw.loss.is_nan() { Some(raw.loss) } else { None };
    let accuracy =
        if has(n, offset_of!(P, accuracy) + size_of::<*const f32>()) && !raw.accuracy.is_null() && raw.n_heads > 0 {
            Some(std::slice::from_raw_parts(raw.accuracy, raw.n_heads as usize))
        } else {
            None
        };
    let report = TrainProgress {
        stage: &stage,
        done: if counts { raw.done } else { 0 },
        total: if counts { raw.total } else { 0 },
        loss,
        accuracy,
    };
    match catch_unwind(AssertUnwindSafe(|| (state.f)(&report))) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(p) => {
            state.panic = Some(p);
            1
        }
    }
}

fn path_string(what: &str, path: &Path) -> Result<CString> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::new(Code::InvalidArgument, format!("{what} contains a NUL byte")))
    }
    #[cfg(not(unix))]
    {
        let s = path.to_str().ok_or_else(|| Error::new(Code::InvalidArgument, format!("{what} is not valid UTF-8")))?;
        c_string(what, s)
    }
}

impl Registry {
    /// Trains the weights of the drafter plugin `plugin` (e.g. "medusa") for `target` and writes
    /// them to `params.out_path`; open the result with [`Registry::open_drafter`] (for
    /// `medusa`: config `path=<out_path>`). Takes the target for the whole call (no session
    /// may use it). Errors: [`Code::Unsupported`] when the plugin has nothing to train (every
    /// drafter but `medusa`, and drafters written in Rust), [`Code::NotFound`],
    /// [`Code::InvalidArgument`] (e.g. an empty `out_path`), [`Code::Config`], [`Code::Io`],
    /// [`Code::Cancelled`] when the progress callback stopped it, and the plugin's own.
    pub fn train_drafter(&self, plugin: &str, target: &mut Target, params: TrainParams<'_>) -> Result<()> {
        let TrainParams { config, corpus, out_path, mut progress } = params;
        let plugin = c_string("plugin", plugin)?;
        let config = if config.is_empty() { None } else { Some(c_string("config", &config)?) };
        let out_path = path_string("out_path", &out_path)?;
        let corpus = corpus.iter().map(|p| path_string("a corpus path", p)).collect::<Result<Vec<_>>>()?;
        let corpus_ptrs: Vec<*const c_char> = corpus.iter().map(|c| c.as_ptr()).collect();
        let n_corpus =
            i32::try_from(corpus_ptrs.len()).map_err(|_| Error::new(Code::InvalidArgument, "too many corpus files"))?;

        let mut p: sys::specinfer_train_params = unsafe { std::mem::zeroed() };
        unsafe { sys::specinfer_train_params_init(&mut p) };
        p.config = config.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        p.corpus = if corpus_ptrs.is_empty() { ptr::null() } else { corpus_ptrs.as_ptr() };
        p.n_corpus = n_corpus;
        p.out_path = out_path.as_ptr();
        let mut state = progress.as_mut().map(|f| ProgressState { f, panic: None });
        if let Some(state) = state.as_mut() {
            p.progress = Some(on_progress);
            p.user = (state as *mut ProgressState<'_, '_>).cast();
        }
        let mut err = ptr::null_mut();
        let st = unsafe { sys::specinfer_drafter_train(self.raw(), plugin.as_ptr(), target.raw(), &p, &mut err) };
        if let Some(panic) = state.and_then(|s| s.panic) {
            unsafe { sys::specinfer_free(err.cast()) };
            resume_unwind(panic);
        }
        unsafe { check_msg(st, err) }
    }
}
