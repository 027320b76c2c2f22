use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

use specinfer_sys as sys;

/// A specinfer status code other than OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument,
    OutOfMemory,
    NotFound,
    Io,
    Format,
    AbiMismatch,
    Unsupported,
    Config,
    State,
    Cancelled,
    Plugin,
    ContextFull,
    BufferTooSmall,
    Internal,
    /// A value this version of the bindings does not know.
    Other(i32),
}

impl Code {
    pub fn from_status(status: sys::specinfer_status) -> Code {
        match status {
            sys::SPECINFER_ERR_INVALID_ARGUMENT => Code::InvalidArgument,
            sys::SPECINFER_ERR_OUT_OF_MEMORY => Code::OutOfMemory,
            sys::SPECINFER_ERR_NOT_FOUND => Code::NotFound,
            sys::SPECINFER_ERR_IO => Code::Io,
            sys::SPECINFER_ERR_FORMAT => Code::Format,
            sys::SPECINFER_ERR_ABI_MISMATCH => Code::AbiMismatch,
            sys::SPECINFER_ERR_UNSUPPORTED => Code::Unsupported,
            sys::SPECINFER_ERR_CONFIG => Code::Config,
            sys::SPECINFER_ERR_STATE => Code::State,
            sys::SPECINFER_ERR_CANCELLED => Code::Cancelled,
            sys::SPECINFER_ERR_PLUGIN => Code::Plugin,
            sys::SPECINFER_ERR_CONTEXT_FULL => Code::ContextFull,
            sys::SPECINFER_ERR_BUFFER_TOO_SMALL => Code::BufferTooSmall,
            sys::SPECINFER_ERR_INTERNAL => Code::Internal,
            other => Code::Other(other),
        }
    }

    /// The C status value.
    pub fn status(self) -> sys::specinfer_status {
        match self {
            Code::InvalidArgument => sys::SPECINFER_ERR_INVALID_ARGUMENT,
            Code::OutOfMemory => sys::SPECINFER_ERR_OUT_OF_MEMORY,
            Code::NotFound => sys::SPECINFER_ERR_NOT_FOUND,
            Code::Io => sys::SPECINFER_ERR_IO,
            Code::Format => sys::SPECINFER_ERR_FORMAT,
            Code::AbiMismatch => sys::SPECINFER_ERR_ABI_MISMATCH,
            Code::Unsupported => sys::SPECINFER_ERR_UNSUPPORTED,
            Code::Config => sys::SPECINFER_ERR_CONFIG,
            Code::State => sys::SPECINFER_ERR_STATE,
            Code::Cancelled => sys::SPECINFER_ERR_CANCELLED,
            Code::Plugin => sys::SPECINFER_ERR_PLUGIN,
            Code::ContextFull => sys::SPECINFER_ERR_CONTEXT_FULL,
            Code::BufferTooSmall => sys::SPECINFER_ERR_BUFFER_TOO_SMALL,
            Code::Internal => sys::SPECINFER_ERR_INTERNAL,
            Code::Other(v) => v,
        }
    }

    /// The library's name of the code, e.g. "SPECINFER_ERR_CONFIG".
    pub fn name(self) -> &'static str {
        // SAFETY: specinfer_status_str returns a static string for every value.
        unsafe { CStr::from_ptr(sys::specinfer_status_str(self.status())) }.to_str().unwrap_or("?")
    }
}

/// An error reported by specinfer: its status code and the library's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: Code,
    message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }
    pub fn code(&self) -> Code {
        self.code
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Copies a C string that may be NULL.
pub(crate) unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Turns a status and an errmsg the library allocated into a Result, freeing the message.
pub(crate) unsafe fn check_msg(status: sys::specinfer_status, errmsg: *mut c_char) -> Result<()> {
    let message = cstr(errmsg);
    sys::specinfer_free(errmsg.cast());
    if status == sys::SPECINFER_OK {
        Ok(())
    } else {
        Err(Error::new(Code::from_status(status), message))
    }
}

/// Turns a status into a Result whose message comes from `errmsg()` (a handle's last error).
pub(crate) fn check_with(status: sys::specinfer_status, errmsg: impl FnOnce() -> String) -> Result<()> {
    if status == sys::SPECINFER_OK {
        Ok(())
    } else {
        let mut message = errmsg();
        if message.is_empty() {
            message = Code::from_status(status).name().to_string();
        }
        Err(Error::new(Code::from_status(status), message))
    }
}

pub(crate) fn c_string(what: &str, s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| Error::new(Code::InvalidArgument, format!("{what} contains a NUL byte")))
}
