use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use specinfer_sys as sys;

use crate::error::{c_string, check_msg, cstr, Result};
use crate::{live_dec, live_inc, NotSync, Registry, Target, TargetInner};

/// What the text a session generates must match ([`Session::set_constraint`]): a grammar compiled
/// by a constraint plugin for the vocabulary of one target, which it keeps alive.
///
/// A session borrows the constraint mutably for its whole life, so one session uses it at a time
/// and it cannot be dropped while in use; once the session is dropped, the constraint serves the
/// next one. For several sessions at once, [`Constraint::fork`] makes more without compiling the
/// grammar again. `Send` but not `Sync`, like a target.
///
/// ```no_run
/// # use specinfer::{Registry, Session, SessionParams};
/// # fn f(registry: &Registry) -> specinfer::Result<()> {
/// let mut target = registry.open_target("kgram", "path=corpus.txt,k=3")?;
/// let mut letters = registry.open_constraint("llguidance", "", &target, "regex", "[a-e]+")?;
/// let mut session = Session::new(&mut target, None, None, &SessionParams::default())?;
/// session.set_constraint(Some(&mut letters))?;
/// session.feed_text("the ")?;
/// session.generate(10)?;
/// # Ok(()) }
/// ```
///
/// Dropping the constraint while the session may still use it does not compile (the C library
/// would refuse to destroy it: `STATE`):
///
/// ```compile_fail,E0505
/// # use specinfer::{Registry, Session, SessionParams};
/// # fn f(registry: &Registry) -> specinfer::Result<()> {
/// let mut target = registry.open_target("kgram", "path=corpus.txt,k=3")?;
/// let mut letters = registry.open_constraint("llguidance", "", &target, "regex", "[a-e]+")?;
/// let mut session = Session::new(&mut target, None, None, &SessionParams::default())?;
/// session.set_constraint(Some(&mut letters))?;
/// drop(letters); // error[E0505]: cannot move out of `letters` because it is borrowed
/// session.feed_text("the ")?;
/// session.generate(10)?;
/// # Ok(()) }
/// ```
///
/// Nor does setting it on a second session while the first has it (the C library: `STATE`):
///
/// ```compile_fail,E0499
/// # use specinfer::{Registry, Session, SessionParams};
/// # fn f(registry: &Registry) -> specinfer::Result<()> {
/// let mut target = registry.open_target("kgram", "path=corpus.txt,k=3")?;
/// let mut other = target.share()?;
/// let mut letters = registry.open_constraint("llguidance", "", &target, "regex", "[a-e]+")?;
/// let mut session = Session::new(&mut target, None, None, &SessionParams::default())?;
/// let mut second = Session::new(&mut other, None, None, &SessionParams::default())?;
/// session.set_constraint(Some(&mut letters))?;
/// second.set_constraint(Some(&mut letters))?; // error[E0499]: borrowed mutably twice
/// session.feed_text("the ")?;
/// session.generate(10)?;
/// # Ok(()) }
/// ```
///
/// [`Session::set_constraint`]: crate::Session::set_constraint
pub struct Constraint {
    pub(crate) ptr: *mut sys::specinfer_constraint,
    target: Arc<TargetInner>,
    _not_sync: NotSync,
}

// SAFETY: a C constraint may move between threads; it is used by one thread at a time (!Sync),
// and a session that uses it borrows it mutably, so it goes with that session.
unsafe impl Send for Constraint {}

impl Registry {
    /// Compiles `grammar`, of `kind`, with the constraint plugin `plugin` (loaded from the plugin
    /// path like targets) and a `key=value,...` config, for `target`'s vocabulary. The plugin
    /// "llguidance" knows the kinds "json_schema" (a JSON Schema), "json_object" (any JSON object;
    /// grammar ignored), "regex" (a regular expression the whole text matches) and "lark" (a
    /// context-free grammar in Lark syntax). The constraint serves sessions on `target` or on a
    /// target sharing its model ([`Target::share`]).
    ///
    /// Errors: [`Code::NotFound`](crate::Code::NotFound) (no such plugin, or it provides no
    /// constraints), `InvalidArgument` (a grammar that does not compile: the message says why),
    /// `Unsupported` (a kind the plugin does not know), `Config`, `Plugin`.
    pub fn open_constraint(
        &self,
        plugin: &str,
        config: &str,
        target: &Target,
        kind: &str,
        grammar: &str,
    ) -> Result<Constraint> {
        let plugin = c_string("plugin", plugin)?;
        let config = c_string("config", config)?;
        let kind = c_string("kind", kind)?;
        let grammar = c_string("grammar", grammar)?;
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_constraint_open(
                    self.raw(),
                    plugin.as_ptr(),
                    config.as_ptr(),
                    target.raw(),
                    kind.as_ptr(),
                    grammar.as_ptr(),
                    &mut out,
                    &mut err,
                ),
                err,
            )?;
        }
        live_inc();
        Ok(Constraint { ptr: out, target: target.inner.clone(), _not_sync: PhantomData })
    }
}

impl Constraint {
    /// A new constraint in this one's present state, sharing its compiled grammar: one for each
    /// of several sessions on one grammar.
    pub fn fork(&self) -> Result<Constraint> {
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe { check_msg(sys::specinfer_constraint_fork(self.ptr, &mut out, &mut err), err)? };
        live_inc();
        Ok(Constraint { ptr: out, target: self.target.clone(), _not_sync: PhantomData })
    }

    /// The constraint's last error message; empty when none.
    pub fn errmsg(&self) -> String {
        unsafe { cstr(sys::specinfer_constraint_errmsg(self.ptr)) }
    }
}

impl Drop for Constraint {
    fn drop(&mut self) {
        // No session borrows it now. Only a session leaked with it set (std::mem::forget) still
        // uses it: the library then refuses (STATE) and the C constraint stays, leaked with it.
        if unsafe { sys::specinfer_constraint_destroy(self.ptr) } == sys::SPECINFER_OK {
            live_dec();
        }
    }
}
