//! Safe Rust bindings of specinfer, speculative decoding of language models on the CPU.
//!
//! ```no_run
//! use specinfer::{Coupler, Registry, Session, SessionParams};
//! let registry = Registry::new()?;
//! let mut target = registry.open_target("kgram", "path=corpus.txt,k=6")?;
//! let mut drafter = registry.open_drafter("ngram", "n_max=4", &target)?;
//! let coupler = Coupler::new("greedy")?;
//! let mut session = Session::new(&mut target, Some(&mut drafter), Some(&coupler), &SessionParams::default())?;
//! session.feed_text("int main(")?;
//! for chunk in session.stream(100) {
//!     print!("{}", chunk?);
//! }
//! println!("\n{:?}", session.stats()?);
//! # Ok::<(), specinfer::Error>(())
//! ```
//!
//! Ownership: every handle frees its C object when dropped. A [`Target`] and a [`Drafter`] keep
//! their [`Registry`] alive, a `Drafter` and a [`Constraint`] keep their `Target` alive, and a
//! [`Session`] borrows its target, drafter, coupler and constraint, so the C library's order of
//! destruction always holds.
//! Threads: `Registry`, [`Coupler`] and [`Sketcher`] are `Send + Sync`; `Target`, `Drafter`,
//! `Constraint` and `Session` are `Send` (used by one thread at a time), as the C ABI says.
//!
//! Structured output: [`Registry::open_constraint`] compiles a grammar (a JSON Schema, a regular
//! expression, a Lark grammar) for a target's vocabulary, and [`Session::set_constraint`] makes
//! the generated text match it. [`Session::set_logprobs`] and [`Session::step_logprobs`] give
//! each emitted token's log-probability with its most likely alternatives.
//!
//! One model, many users: [`Target::share`] opens another target on a target's loaded model
//! (weights shared, a KV cache of its own). Each share is a `Target` of its own, `Send`, so it
//! moves to another thread and runs a session there while the others run theirs.
//! [`Session::step_many`] runs one round of several sessions with one target pass for those
//! whose targets share a model, and [`Session::feed_from`] starts a session from another's
//! scored prompt.
//!
//! Drafters with weights (Medusa heads: `medusa`) are trained for a target with
//! [`Registry::train_drafter`] (or `specinfer train-heads`) and opened like any other drafter.

mod constraint;
mod error;
pub mod plugin;
mod session;
mod sketcher;
mod train;

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};

pub use constraint::Constraint;
pub use error::{Code, Error, Result};
pub use session::{Session, SessionParams, Stats, Step, StepParams, TextStream, TokenLogprob, MAX_TOP_LOGPROBS};
pub use sketcher::{SketchHeader, Sketcher, SketcherInfo};
pub use specinfer_sys as sys;
pub use train::{ProgressFn, TrainParams, TrainProgress};

use error::{c_string, check_msg, check_with, cstr};

static LIVE: AtomicIsize = AtomicIsize::new(0);

pub(crate) fn live_inc() {
    LIVE.fetch_add(1, Ordering::SeqCst);
}
pub(crate) fn live_dec() {
    LIVE.fetch_sub(1, Ordering::SeqCst);
}

/// The number of C objects (registries, targets, drafters, constraints, couplers, sessions,
/// sketchers, and instances of drafters written in Rust) created through these bindings and not yet freed.
pub fn live_handles() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// The version of the loaded library, e.g. "0.1.0".
pub fn version() -> String {
    unsafe { cstr(sys::specinfer_version_string()) }
}

/// Marker that makes a type `!Sync` (it stays `Send`).
type NotSync = PhantomData<Cell<()>>;

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

struct RegistryInner {
    ptr: *mut sys::specinfer_registry,
    /// Slots of the in-process drafters registered here: (plugin name, slot).
    slots: Mutex<Vec<(String, usize)>>,
}

// SAFETY: the C registry may be used from several threads at once.
unsafe impl Send for RegistryInner {}
unsafe impl Sync for RegistryInner {}

impl Drop for RegistryInner {
    fn drop(&mut self) {
        // Every target and drafter holds a clone of the registry, so none is open now.
        let st = unsafe { sys::specinfer_registry_destroy(self.ptr) };
        live_dec();
        if st == sys::SPECINFER_OK {
            for (_, slot) in self.slots.lock().unwrap().drain(..) {
                plugin::release_slot(slot);
            }
        }
    }
}

/// What the registry says of one loaded plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    /// The file it came from; empty for an in-process plugin.
    pub path: String,
    pub has_target: bool,
    pub has_drafter: bool,
    /// Provides constraints ([`Registry::open_constraint`]).
    pub has_constraint: bool,
    pub abi_version: u32,
}

/// The set of loaded plugins and the backend's thread pool. Cheap to clone (shared).
#[derive(Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

impl Registry {
    /// A registry with the default settings (threads from SPECINFER_THREADS, else all cores).
    pub fn new() -> Result<Registry> {
        Registry::with_threads(0)
    }

    /// A registry whose backend uses `n_threads` threads (0 = the default).
    pub fn with_threads(n_threads: i32) -> Result<Registry> {
        unsafe {
            let mut p: sys::specinfer_registry_params = std::mem::zeroed();
            sys::specinfer_registry_params_init(&mut p);
            p.n_threads = n_threads;
            let mut out = ptr::null_mut();
            let mut err = ptr::null_mut();
            check_msg(sys::specinfer_registry_create(&p, &mut out, &mut err), err)?;
            live_inc();
            Ok(Registry { inner: Arc::new(RegistryInner { ptr: out, slots: Mutex::new(Vec::new()) }) })
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::specinfer_registry {
        self.inner.ptr
    }

    /// The colon-separated plugin search path.
    pub fn plugin_path(&self) -> String {
        unsafe { cstr(sys::specinfer_registry_plugin_path(self.raw())) }
    }

    /// Backend threads in use.
    pub fn threads(&self) -> i32 {
        unsafe { sys::specinfer_registry_threads(self.raw()) }
    }

    /// Loads one plugin file.
    pub fn load_plugin(&self, path: &str) -> Result<()> {
        let path = c_string("path", path)?;
        let mut err = ptr::null_mut();
        unsafe { check_msg(sys::specinfer_registry_load_plugin(self.raw(), path.as_ptr(), &mut err), err) }
    }

    /// Unloads a plugin by name (an in-process drafter too).
    pub fn unload_plugin(&self, name: &str) -> Result<()> {
        let cname = c_string("name", name)?;
        let mut err = ptr::null_mut();
        unsafe { check_msg(sys::specinfer_registry_unload_plugin(self.raw(), cname.as_ptr(), &mut err), err)? };
        let mut slots = self.inner.slots.lock().unwrap();
        if let Some(i) = slots.iter().position(|(n, _)| n == name) {
            plugin::release_slot(slots.remove(i).1);
        }
        Ok(())
    }

    /// The loaded plugins.
    pub fn plugins(&self) -> Result<Vec<PluginInfo>> {
        let n = unsafe { sys::specinfer_registry_plugin_count(self.raw()) };
        (0..n)
            .map(|i| unsafe {
                let mut info: sys::specinfer_plugin_info = std::mem::zeroed();
                info.struct_size = std::mem::size_of::<sys::specinfer_plugin_info>() as u32;
                check_with(sys::specinfer_registry_plugin_info(self.raw(), i, &mut info), || {
                    format!("plugin_info({i}) failed")
                })?;
                Ok(PluginInfo {
                    name: cstr(info.name),
                    version: cstr(info.version),
                    description: cstr(info.description),
                    path: cstr(info.path),
                    has_target: info.has_target != 0,
                    has_drafter: info.has_drafter != 0,
                    has_constraint: info.has_constraint != 0,
                    abi_version: info.abi_version,
                })
            })
            .collect()
    }

    /// Opens a target ("kgram", "gguf", ...) with a `key=value,...` config.
    pub fn open_target(&self, plugin: &str, config: &str) -> Result<Target> {
        let plugin = c_string("plugin", plugin)?;
        let config = c_string("config", config)?;
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_target_open(self.raw(), plugin.as_ptr(), config.as_ptr(), &mut out, &mut err),
                err,
            )?;
        }
        live_inc();
        Ok(Target { inner: Arc::new(TargetInner { ptr: out, _registry: self.clone() }), _not_sync: PhantomData })
    }

    /// Opens a drafter ("ngram", "kgram", an in-process one, ...) for `target`.
    pub fn open_drafter(&self, plugin: &str, config: &str, target: &Target) -> Result<Drafter> {
        let plugin = c_string("plugin", plugin)?;
        let config = c_string("config", config)?;
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_drafter_open(
                    self.raw(),
                    plugin.as_ptr(),
                    config.as_ptr(),
                    target.inner.ptr,
                    &mut out,
                    &mut err,
                ),
                err,
            )?;
        }
        live_inc();
        Ok(Drafter { ptr: out, _target: target.inner.clone(), _not_sync: PhantomData })
    }

    /// Registers a drafter written in Rust under `name`: `factory` makes one instance per
    /// [`Registry::open_drafter`] call. At most [`plugin::MAX_IN_PROCESS`] such drafters may be
    /// registered at once in a process.
    pub fn register_drafter<F: plugin::DrafterFactory>(&self, name: &str, description: &str, factory: F) -> Result<()> {
        let slot = plugin::claim_slot(name, description, Box::new(factory))?;
        let mut err = ptr::null_mut();
        let st = unsafe { sys::specinfer_registry_register_plugin(self.raw(), plugin::descriptor(slot), &mut err) };
        if let Err(e) = unsafe { check_msg(st, err) } {
            plugin::release_slot(slot);
            return Err(e);
        }
        self.inner.slots.lock().unwrap().push((name.to_string(), slot));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Targets and drafters
// ---------------------------------------------------------------------------------------------

pub(crate) struct TargetInner {
    pub(crate) ptr: *mut sys::specinfer_target,
    _registry: Registry,
}

// SAFETY: shared (through Arc) only to keep the C target alive for drafters opened on it; all
// calls go through `Target`, which is !Sync, or through a Session that borrows it mutably.
unsafe impl Send for TargetInner {}
unsafe impl Sync for TargetInner {}

impl Drop for TargetInner {
    fn drop(&mut self) {
        unsafe { sys::specinfer_target_destroy(self.ptr) };
        live_dec();
    }
}

/// What a target says of its model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub vocab_size: i32,
    pub n_ctx: i32,
    pub hidden_size: i32,
    pub bos_token: i32,
    pub eos_token: i32,
    pub eot_token: i32,
    pub add_bos: bool,
    pub name: String,
    pub arch: String,
    /// Every token that ends generation (eos and eot among them), in increasing order.
    pub eog_tokens: Vec<i32>,
    /// The model's Jinja chat template (a GGUF's `tokenizer.chat_template`), if it has one.
    pub chat_template: Option<String>,
}

impl ModelInfo {
    pub(crate) unsafe fn from_raw(i: &sys::specinfer_model_info) -> ModelInfo {
        ModelInfo {
            vocab_size: i.vocab_size,
            n_ctx: i.n_ctx,
            hidden_size: i.hidden_size,
            bos_token: i.bos_token,
            eos_token: i.eos_token,
            eot_token: i.eot_token,
            add_bos: i.add_bos != 0,
            name: cstr(i.name),
            arch: cstr(i.arch),
            eog_tokens: if i.eog_tokens.is_null() || i.n_eog_tokens <= 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(i.eog_tokens, i.n_eog_tokens as usize).to_vec()
            },
            chat_template: if i.chat_template.is_null() { None } else { Some(cstr(i.chat_template)) },
        }
    }
}

/// A model whose text we want: holds a loaded model (weights, shared with the targets made by
/// [`Target::share`]) and a KV cache of its own.
///
/// `Send` but not `Sync`: a target is used by one thread at a time. Targets that share a loaded
/// model are separate `Target`s, so each may be moved to its own thread and used there at the
/// same time as the others; they are dropped in any order (the model stays loaded until the last
/// one goes).
pub struct Target {
    pub(crate) inner: Arc<TargetInner>,
    _not_sync: NotSync,
}

impl Target {
    pub(crate) fn raw(&self) -> *mut sys::specinfer_target {
        self.inner.ptr
    }

    fn errmsg(&self) -> String {
        unsafe { cstr(sys::specinfer_target_errmsg(self.raw())) }
    }

    /// Another target on the model this one has loaded: the weights and tokenizer are shared,
    /// not loaded again, and the new target has an empty KV cache of its own. The way to serve
    /// many users from one copy of the weights: keep one target as the model's handle and give
    /// each session (each thread) a share of it. (A target borrowed by a session cannot be
    /// shared until the session ends; share from another one.) Fails with
    /// [`Code::Unsupported`] when the plugin cannot share (open the target again instead).
    pub fn share(&self) -> Result<Target> {
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe { check_msg(sys::specinfer_target_share(self.raw(), &mut out, &mut err), err)? };
        live_inc();
        Ok(Target {
            inner: Arc::new(TargetInner { ptr: out, _registry: self.inner._registry.clone() }),
            _not_sync: PhantomData,
        })
    }

    pub fn info(&self) -> Result<ModelInfo> {
        unsafe {
            let mut i: sys::specinfer_model_info = std::mem::zeroed();
            sys::specinfer_model_info_init(&mut i);
            check_with(sys::specinfer_target_info(self.raw(), &mut i), || self.errmsg())?;
            Ok(ModelInfo::from_raw(&i))
        }
    }

    /// Text -> token ids.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<i32>> {
        let mut n = 0usize;
        let mut buf = vec![0i32; text.len() + 8];
        loop {
            let st = unsafe {
                sys::specinfer_target_tokenize(
                    self.raw(),
                    text.as_ptr().cast(),
                    text.len(),
                    add_special as i32,
                    parse_special as i32,
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut n,
                )
            };
            if st == sys::SPECINFER_ERR_BUFFER_TOO_SMALL && n > buf.len() {
                buf.resize(n, 0);
                continue;
            }
            check_with(st, || self.errmsg())?;
            buf.truncate(n);
            return Ok(buf);
        }
    }

    /// Token ids -> the bytes of their text (whole sequences decode to whole UTF-8 text).
    pub fn detokenize(&self, tokens: &[i32]) -> Result<Vec<u8>> {
        let mut n = 0usize;
        let mut buf = vec![0u8; tokens.len() * 4 + 16];
        loop {
            let st = unsafe {
                sys::specinfer_target_detokenize(
                    self.raw(),
                    tokens.as_ptr(),
                    tokens.len(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut n,
                )
            };
            if st == sys::SPECINFER_ERR_BUFFER_TOO_SMALL && n > buf.len() {
                buf.resize(n, 0);
                continue;
            }
            check_with(st, || self.errmsg())?;
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

/// A cheap proposer opened from a plugin (or registered in-process with
/// [`Registry::register_drafter`]). Keeps its target alive.
pub struct Drafter {
    pub(crate) ptr: *mut sys::specinfer_drafter,
    _target: Arc<TargetInner>,
    _not_sync: NotSync,
}

// SAFETY: a C drafter may move between threads; it is used by one thread at a time (!Sync).
unsafe impl Send for Drafter {}
unsafe impl Send for Target {}

impl Drafter {
    pub fn errmsg(&self) -> String {
        unsafe { cstr(sys::specinfer_drafter_errmsg(self.ptr)) }
    }
}

impl Drop for Drafter {
    fn drop(&mut self) {
        unsafe { sys::specinfer_drafter_destroy(self.ptr) };
        live_dec();
    }
}

// ---------------------------------------------------------------------------------------------
// Couplers
// ---------------------------------------------------------------------------------------------

/// Decides which drafted tokens the target keeps ("greedy", "rejection", "gumbel", ...).
/// Immutable; shared freely between threads.
pub struct Coupler {
    ptr: *mut sys::specinfer_coupler,
}

// SAFETY: couplers are immutable after creation and thread-safe (C ABI).
unsafe impl Send for Coupler {}
unsafe impl Sync for Coupler {}

/// The outcome of verifying a draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Length of the kept prefix of the draft.
    pub n_accepted: i32,
    /// The next token: the correction after a refusal, or the bonus token.
    pub token: i32,
}

impl Coupler {
    pub fn new(spec: &str) -> Result<Coupler> {
        let spec = c_string("spec", spec)?;
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe { check_msg(sys::specinfer_coupler_create(spec.as_ptr(), &mut out, &mut err), err)? };
        live_inc();
        Ok(Coupler { ptr: out })
    }

    pub(crate) fn raw(&self) -> *const sys::specinfer_coupler {
        self.ptr
    }

    /// The canonical spec, e.g. "lenient:0.5".
    pub fn name(&self) -> String {
        unsafe { cstr(sys::specinfer_coupler_name(self.ptr)) }
    }

    /// True when the emitted text is distributed exactly as the target's.
    pub fn is_exact(&self) -> bool {
        unsafe { sys::specinfer_coupler_is_exact(self.ptr) != 0 }
    }

    /// Verifies a chain `draft` of k tokens: `p` holds k + 1 rows of `vocab` probabilities,
    /// `q` k rows (or None for point masses).
    pub fn verify(
        &self,
        vocab: i32,
        p: &[f32],
        q: Option<&[f32]>,
        draft: &[i32],
        seed: u64,
        position: i64,
    ) -> Result<Verdict> {
        let (qp, ql) = q.map_or((ptr::null(), 0), |q| (q.as_ptr(), q.len()));
        let mut v = Verdict { n_accepted: 0, token: -1 };
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_coupler_verify(
                    self.ptr,
                    vocab,
                    draft.len() as i32,
                    p.as_ptr(),
                    p.len(),
                    qp,
                    ql,
                    draft.as_ptr(),
                    seed,
                    position,
                    &mut v.n_accepted,
                    &mut v.token,
                    &mut err,
                ),
                err,
            )?;
        }
        Ok(v)
    }

    /// Draws one draft token from `q` the way this coupler wants the draft side sampled.
    pub fn draft_sample(&self, q: &[f32], seed: u64, position: i64) -> Result<i32> {
        let mut token = -1;
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_coupler_draft_sample(
                    self.ptr,
                    q.len() as i32,
                    q.as_ptr(),
                    q.len(),
                    seed,
                    position,
                    &mut token,
                    &mut err,
                ),
                err,
            )?;
        }
        Ok(token)
    }
}

impl Drop for Coupler {
    fn drop(&mut self) {
        unsafe { sys::specinfer_coupler_destroy(self.ptr) };
        live_dec();
    }
}
