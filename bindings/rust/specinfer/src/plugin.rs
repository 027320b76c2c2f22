//! Drafters written in Rust, registered in-process with [`crate::Registry::register_drafter`].
//!
//! ```no_run
//! use specinfer::plugin::{Draft, DraftRequest, Drafter};
//! struct Repeat;
//! impl Drafter for Repeat {
//!     fn propose(&mut self, req: &DraftRequest<'_>, draft: &mut Draft<'_>) -> specinfer::Result<()> {
//!         let last = *req.context().last().unwrap();
//!         for _ in 0..req.max_tokens() { draft.push(last)?; }
//!         Ok(())
//!     }
//! }
//! let registry = specinfer::Registry::new()?;
//! registry.register_drafter("repeat", "repeats the last token", |_cfg: &str, _info: &specinfer::ModelInfo| {
//!     Ok(Box::new(Repeat) as Box<dyn Drafter>)
//! })?;
//! # Ok::<(), specinfer::Error>(())
//! ```
//!
//! The C plugin ABI passes no user pointer to `get_factory` or to the factory's `create`, so
//! each registration takes one of [`MAX_IN_PROCESS`] slots, each with its own C entry points.

use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use specinfer_sys as sys;

use crate::error::{c_string, Code, Error, Result};
use crate::{live_dec, live_inc, ModelInfo};

/// A drafter: proposes tokens that the target then verifies. One instance serves one session;
/// the library calls it from one thread at a time.
pub trait Drafter: Send {
    /// A new sequence begins with `context` (the prompt).
    fn begin(&mut self, context: &[i32]) -> Result<()> {
        let _ = context;
        Ok(())
    }
    /// Proposes up to `req.max_tokens()` tokens continuing `req.context()`, pushing them into
    /// `draft` (a chain; pushing nothing proposes nothing).
    fn propose(&mut self, req: &DraftRequest<'_>, draft: &mut Draft<'_>) -> Result<()>;
    /// Tokens appended to the sequence (the accepted draft and the corrected token).
    fn commit(&mut self, tokens: &[i32]) -> Result<()> {
        let _ = tokens;
        Ok(())
    }
}

/// Makes drafter instances from a `key=value,...` config and the target's model info.
/// Implemented for closures `Fn(&str, &ModelInfo) -> Result<Box<dyn Drafter>>`.
pub trait DrafterFactory: Send + Sync + 'static {
    fn create(&self, config: &str, target: &ModelInfo) -> Result<Box<dyn Drafter>>;
}

impl<F> DrafterFactory for F
where
    F: Fn(&str, &ModelInfo) -> Result<Box<dyn Drafter>> + Send + Sync + 'static,
{
    fn create(&self, config: &str, target: &ModelInfo) -> Result<Box<dyn Drafter>> {
        self(config, target)
    }
}

/// What the session asks of a drafter.
pub struct DraftRequest<'a> {
    raw: &'a sys::specinfer_draft_request,
}

/// Where the fields that the request grew after `sample_ctx` end: a library older than them
/// hands a smaller struct_size, and they are not read.
const HIDDEN_END: usize =
    std::mem::offset_of!(sys::specinfer_draft_request, hidden_position) + std::mem::size_of::<i64>();
const PASS_COST_END: usize =
    std::mem::offset_of!(sys::specinfer_draft_request, n_pass_cost) + std::mem::size_of::<i32>();

impl DraftRequest<'_> {
    pub fn max_tokens(&self) -> usize {
        self.raw.max_tokens.max(0) as usize
    }
    /// The whole committed sequence, prompt included.
    pub fn context(&self) -> &[i32] {
        unsafe { slice(self.raw.context, self.raw.n_context) }
    }
    pub fn temperature(&self) -> f32 {
        self.raw.temperature
    }
    pub fn seed(&self) -> u64 {
        self.raw.seed
    }
    /// Draws a token from `q` as the session's coupler wants the draft side sampled, for the
    /// token at sequence index `position`. None when the session gave no sampler.
    pub fn sample(&self, q: &[f32], position: i64) -> Option<i32> {
        self.raw.sample.map(|f| unsafe { f(self.raw.sample_ctx, q.as_ptr(), q.len() as i32, position) })
    }

    fn covers(&self, end: usize) -> bool {
        self.raw.struct_size as usize >= end
    }

    /// The target's last hidden state (the input of its output layer, `hidden_size` floats) at
    /// sequence index [`hidden_position`](Self::hidden_position): the position whose logits chose
    /// the last committed token. None when the session has none (a target without hidden states,
    /// such as kgram, or a library older than this field).
    pub fn hidden(&self) -> Option<&[f32]> {
        if !self.covers(HIDDEN_END) || self.raw.hidden.is_null() || self.raw.hidden_size <= 0 {
            return None;
        }
        Some(unsafe { std::slice::from_raw_parts(self.raw.hidden, self.raw.hidden_size as usize) })
    }

    /// The sequence index of [`hidden`](Self::hidden), `context().len() - 2`; -1 when there is no
    /// hidden state.
    pub fn hidden_position(&self) -> i64 {
        if self.hidden().is_some() {
            self.raw.hidden_position
        } else {
            -1
        }
    }

    /// `pass_cost()[i]`: the time of one target pass over i + 1 tokens (the last committed token
    /// and i drafted ones) relative to a one-token pass, as the session measured it on this
    /// machine; `max_tokens() + 1` entries, the first 1.0. A drafter that sizes its own draft
    /// weighs what a token is expected to add against this cost. Empty with a library older than
    /// this field.
    pub fn pass_cost(&self) -> &[f32] {
        if !self.covers(PASS_COST_END) || self.raw.n_pass_cost <= 0 {
            return &[];
        }
        unsafe { slice(self.raw.pass_cost, self.raw.n_pass_cost as usize) }
    }
}

/// The draft being written: a chain of tokens, each a point mass or drawn from a distribution.
pub struct Draft<'a> {
    raw: &'a mut sys::specinfer_draft,
}

impl Draft<'_> {
    /// Room for this many tokens.
    pub fn capacity(&self) -> usize {
        self.raw.cap.max(0) as usize
    }
    pub fn len(&self) -> usize {
        self.raw.n_nodes as usize
    }
    pub fn is_empty(&self) -> bool {
        self.raw.n_nodes == 0
    }
    pub fn vocab_size(&self) -> usize {
        self.raw.vocab_size as usize
    }

    fn push_node(&mut self, token: i32, probs: Option<&[f32]>) -> Result<()> {
        let i = self.raw.n_nodes;
        if i >= self.raw.cap {
            return Err(Error::new(Code::InvalidArgument, format!("the draft is full ({} tokens)", self.raw.cap)));
        }
        if token < 0 || token >= self.raw.vocab_size {
            return Err(Error::new(Code::InvalidArgument, format!("token {token} is outside the vocabulary")));
        }
        if i > 0 && (self.raw.has_probs != 0) != probs.is_some() {
            return Err(Error::new(Code::InvalidArgument, "a draft mixes point masses and distributions"));
        }
        unsafe {
            *self.raw.tokens.add(i as usize) = token;
            *self.raw.parents.add(i as usize) = i - 1;
            if let Some(q) = probs {
                let v = self.raw.vocab_size as usize;
                if q.len() != v {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        format!("q has {} entries, vocabulary {v}", q.len()),
                    ));
                }
                std::ptr::copy_nonoverlapping(q.as_ptr(), self.raw.probs.add(i as usize * v), v);
            }
        }
        self.raw.has_probs = probs.is_some() as i32;
        self.raw.n_nodes = i + 1;
        Ok(())
    }

    /// Appends a deterministic token (a point mass).
    pub fn push(&mut self, token: i32) -> Result<()> {
        self.push_node(token, None)
    }

    /// Appends a token drawn from the distribution `q` (vocab_size probabilities).
    pub fn push_sampled(&mut self, token: i32, q: &[f32]) -> Result<()> {
        self.push_node(token, Some(q))
    }

    /// How many of the tokens pushed so far the drafter expects the target to keep (0 to
    /// `len()`): the session's statistics show the estimates beside what was kept. Without a
    /// call the draft gives no estimate.
    pub fn set_expected_accepted(&mut self, expected: f64) -> Result<()> {
        let n = self.len();
        if !(expected >= 0.0 && expected <= n as f64) {
            return Err(Error::new(
                Code::InvalidArgument,
                format!("the draft expects {expected} accepted tokens, not within 0..{n} (its length)"),
            ));
        }
        // A host whose draft has the field (struct_size covers it) shows the estimate.
        let end = std::mem::offset_of!(sys::specinfer_draft, expected_accepted) + std::mem::size_of::<f64>();
        if self.raw.struct_size as usize >= end {
            self.raw.expected_accepted = expected;
        }
        Ok(())
    }
}

unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p, n)
    }
}

/// Writes `msg` into a plugin error buffer (NUL-terminated, cut at 511 bytes).
unsafe fn write_err(err: *mut sys::specinfer_plugin_error, msg: &str) {
    if err.is_null() {
        return;
    }
    let buf = &mut (*err).message;
    let mut n = msg.len().min(buf.len() - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    for (d, s) in buf.iter_mut().zip(msg.as_bytes()[..n].iter()) {
        *d = *s as c_char;
    }
    buf[n] = 0;
}

/// Runs a drafter call, turning an Err or a panic into a status and a message.
unsafe fn guard(err: *mut sys::specinfer_plugin_error, f: impl FnOnce() -> Result<()>) -> sys::specinfer_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => sys::SPECINFER_OK,
        Ok(Err(e)) => {
            write_err(err, e.message());
            match e.code().status() {
                sys::SPECINFER_OK => sys::SPECINFER_ERR_PLUGIN,
                s => s,
            }
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "?".into());
            write_err(err, &format!("the Rust drafter panicked: {what}"));
            sys::SPECINFER_ERR_PLUGIN
        }
    }
}

struct Instance {
    drafter: Box<dyn Drafter>,
}

unsafe extern "C" fn inst_destroy(this: *mut c_void) {
    if !this.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(this as *mut Instance))));
        live_dec();
    }
}

unsafe extern "C" fn inst_begin(
    this: *mut c_void,
    context: *const i32,
    n: usize,
    err: *mut sys::specinfer_plugin_error,
) -> sys::specinfer_status {
    let inst = &mut *(this as *mut Instance);
    guard(err, || inst.drafter.begin(slice(context, n)))
}

unsafe extern "C" fn inst_propose(
    this: *mut c_void,
    req: *const sys::specinfer_draft_request,
    out: *mut sys::specinfer_draft,
    err: *mut sys::specinfer_plugin_error,
) -> sys::specinfer_status {
    let inst = &mut *(this as *mut Instance);
    (*out).n_nodes = 0;
    (*out).has_probs = 0;
    let req = DraftRequest { raw: &*req };
    let mut draft = Draft { raw: &mut *out };
    let st = guard(err, || inst.drafter.propose(&req, &mut draft));
    if st != sys::SPECINFER_OK {
        (*out).n_nodes = 0;
    }
    st
}

unsafe extern "C" fn inst_commit(
    this: *mut c_void,
    tokens: *const i32,
    n: usize,
    err: *mut sys::specinfer_plugin_error,
) -> sys::specinfer_status {
    let inst = &mut *(this as *mut Instance);
    guard(err, || inst.drafter.commit(slice(tokens, n)))
}

static VTABLE: sys::specinfer_drafter_vtable = sys::specinfer_drafter_vtable {
    struct_size: std::mem::size_of::<sys::specinfer_drafter_vtable>() as u32,
    destroy: Some(inst_destroy),
    begin: Some(inst_begin),
    propose: Some(inst_propose),
    commit: Some(inst_commit),
    propose_many: None,
};

// ---- slots ----

/// How many drafters written in Rust may be registered at once in one process.
pub const MAX_IN_PROCESS: usize = 32;

struct Slot {
    factory: Arc<dyn DrafterFactory>,
    descriptor: Box<sys::specinfer_plugin_descriptor>,
    _strings: [CString; 3],
}

// SAFETY: the descriptor's pointers refer to the slot's own immutable strings.
unsafe impl Send for Slot {}

static SLOTS: Mutex<[Option<Slot>; MAX_IN_PROCESS]> = Mutex::new([const { None }; MAX_IN_PROCESS]);

unsafe fn create_in_slot(
    slot: usize,
    config: *const c_char,
    target_info: *const sys::specinfer_model_info,
    this: *mut *mut c_void,
    vtable: *mut *const sys::specinfer_drafter_vtable,
    err: *mut sys::specinfer_plugin_error,
) -> sys::specinfer_status {
    let factory = match SLOTS.lock() {
        Ok(s) => s[slot].as_ref().map(|s| s.factory.clone()),
        Err(_) => None,
    };
    let Some(factory) = factory else {
        write_err(err, "this in-process drafter was unregistered");
        return sys::SPECINFER_ERR_STATE;
    };
    let config = if config.is_null() { String::new() } else { CStr::from_ptr(config).to_string_lossy().into_owned() };
    let info = ModelInfo::from_raw(&*target_info);
    let mut made = None;
    let st = guard(err, || {
        made = Some(factory.create(&config, &info)?);
        Ok(())
    });
    if let (sys::SPECINFER_OK, Some(drafter)) = (st, made) {
        *this = Box::into_raw(Box::new(Instance { drafter })).cast();
        *vtable = &VTABLE;
        live_inc();
    }
    st
}

unsafe extern "C" fn create_n<const N: usize>(
    _host: *const sys::specinfer_host,
    config: *const c_char,
    target_info: *const sys::specinfer_model_info,
    _target: *const sys::specinfer_host_target,
    this: *mut *mut c_void,
    vtable: *mut *const sys::specinfer_drafter_vtable,
    err: *mut sys::specinfer_plugin_error,
) -> sys::specinfer_status {
    create_in_slot(N, config, target_info, this, vtable, err)
}

unsafe extern "C" fn get_factory_n<const N: usize>(id: *const c_char) -> *const c_void {
    if !id.is_null() && CStr::from_ptr(id).to_bytes_with_nul() == sys::SPECINFER_DRAFTER_FACTORY_ID {
        (&FACTORIES[N] as *const sys::specinfer_drafter_factory).cast()
    } else {
        std::ptr::null()
    }
}

const fn factory<const N: usize>() -> sys::specinfer_drafter_factory {
    sys::specinfer_drafter_factory {
        struct_size: std::mem::size_of::<sys::specinfer_drafter_factory>() as u32,
        create: Some(create_n::<N>),
        // A drafter written in Rust has no weights to train: specinfer_drafter_train says so.
        train: None,
    }
}

type GetFactory = unsafe extern "C" fn(*const c_char) -> *const c_void;

macro_rules! slot_tables {
    ($($n:literal)*) => {
        static FACTORIES: [sys::specinfer_drafter_factory; MAX_IN_PROCESS] = [$(factory::<$n>()),*];
        static GET_FACTORY: [GetFactory; MAX_IN_PROCESS] = [$(get_factory_n::<$n>),*];
    };
}
slot_tables!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);

pub(crate) fn claim_slot(name: &str, description: &str, factory: Box<dyn DrafterFactory>) -> Result<usize> {
    let strings = [
        c_string("name", name)?,
        c_string("version", crate::version().as_str())?,
        c_string("description", description)?,
    ];
    let mut slots = SLOTS.lock().map_err(|_| Error::new(Code::Internal, "slot table poisoned"))?;
    let i = slots.iter().position(|s| s.is_none()).ok_or_else(|| {
        Error::new(Code::State, format!("at most {MAX_IN_PROCESS} in-process drafters may be registered at once"))
    })?;
    let descriptor = Box::new(sys::specinfer_plugin_descriptor {
        abi_version: sys::SPECINFER_PLUGIN_ABI_VERSION,
        struct_size: std::mem::size_of::<sys::specinfer_plugin_descriptor>() as u32,
        name: strings[0].as_ptr(),
        version: strings[1].as_ptr(),
        description: strings[2].as_ptr(),
        init: None,
        deinit: None,
        get_factory: Some(GET_FACTORY[i]),
    });
    slots[i] = Some(Slot { factory: Arc::from(factory), descriptor, _strings: strings });
    Ok(i)
}

/// The descriptor of a claimed slot; it stays put until the slot is released.
pub(crate) fn descriptor(slot: usize) -> *const sys::specinfer_plugin_descriptor {
    let slots = SLOTS.lock().unwrap();
    &*slots[slot].as_ref().unwrap().descriptor
}

pub(crate) fn release_slot(slot: usize) {
    if let Ok(mut slots) = SLOTS.lock() {
        slots[slot] = None;
    }
}
