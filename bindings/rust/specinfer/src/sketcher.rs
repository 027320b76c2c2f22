use std::ptr;

use specinfer_sys as sys;

use crate::error::{c_string, check_msg, check_with, cstr, Code, Error, Result};
use crate::{live_dec, live_inc};

/// Compresses vectors into inner-product sketches ("jl", "countsketch", "qjl", "threshold",
/// "priority"). Immutable; shared freely between threads.
pub struct Sketcher {
    ptr: *mut sys::specinfer_sketcher,
}

// SAFETY: sketchers are immutable after creation and thread-safe (C ABI).
unsafe impl Send for Sketcher {}
unsafe impl Sync for Sketcher {}

/// What a sketcher says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SketcherInfo {
    pub kind: String,
    pub dim: i64,
    pub size: i64,
    pub seed: u64,
    pub key_bytes: usize,
    pub query_bytes: usize,
    pub fixed_size: bool,
    pub linear: bool,
    pub simd: String,
}

/// What a sketch's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SketchHeader {
    pub kind: String,
    pub is_query: bool,
    pub dim: i64,
    pub size: i64,
    pub count: i64,
    pub n_bytes: usize,
}

impl Sketcher {
    /// `options` is a `key=value,...` string ("" for none).
    pub fn new(kind: &str, dim: i64, size: i64, seed: u64, options: &str) -> Result<Sketcher> {
        let kind = c_string("kind", kind)?;
        let options = c_string("options", options)?;
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_sketcher_create(kind.as_ptr(), dim, size, seed, options.as_ptr(), &mut out, &mut err),
                err,
            )?
        };
        live_inc();
        Ok(Sketcher { ptr: out })
    }

    pub fn info(&self) -> Result<SketcherInfo> {
        unsafe {
            let mut i: sys::specinfer_sketcher_info = std::mem::zeroed();
            i.struct_size = std::mem::size_of::<sys::specinfer_sketcher_info>() as u32;
            check_with(sys::specinfer_sketcher_get_info(self.ptr, &mut i), || "get_info failed".into())?;
            Ok(SketcherInfo {
                kind: cstr(i.kind),
                dim: i.dim,
                size: i.size,
                seed: i.seed,
                key_bytes: i.key_bytes,
                query_bytes: i.query_bytes,
                fixed_size: i.fixed_size != 0,
                linear: i.linear != 0,
                simd: cstr(i.simd),
            })
        }
    }

    /// Sketches one vector (`query` makes a qjl query sketch).
    pub fn sketch(&self, x: &[f32], query: bool) -> Result<Vec<u8>> {
        let flags = if query { sys::SPECINFER_SKETCH_QUERY } else { 0 };
        let mut need = 0usize;
        let mut err = ptr::null_mut();
        let st = unsafe {
            sys::specinfer_sketcher_sketch(
                self.ptr,
                x.as_ptr(),
                x.len(),
                flags,
                ptr::null_mut(),
                0,
                &mut need,
                &mut err,
            )
        };
        if st != sys::SPECINFER_ERR_BUFFER_TOO_SMALL {
            unsafe { check_msg(st, err)? };
        } else {
            unsafe { sys::specinfer_free(err.cast()) };
        }
        let mut buf = vec![0u8; need];
        let mut n = 0usize;
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_sketcher_sketch(
                    self.ptr,
                    x.as_ptr(),
                    x.len(),
                    flags,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut n,
                    &mut err,
                ),
                err,
            )?
        };
        buf.truncate(n);
        Ok(buf)
    }

    /// Estimates <a, b> from two sketches.
    pub fn estimate(&self, a: &[u8], b: &[u8]) -> Result<f64> {
        let mut v = 0f64;
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_sketcher_estimate(
                    self.ptr,
                    a.as_ptr().cast(),
                    a.len(),
                    b.as_ptr().cast(),
                    b.len(),
                    &mut v,
                    &mut err,
                ),
                err,
            )?
        };
        Ok(v)
    }

    /// Estimates ||a - b||^2 (linear kinds).
    pub fn distance2(&self, a: &[u8], b: &[u8]) -> Result<f64> {
        let mut v = 0f64;
        let mut err = ptr::null_mut();
        unsafe {
            check_msg(
                sys::specinfer_sketcher_distance2(
                    self.ptr,
                    a.as_ptr().cast(),
                    a.len(),
                    b.as_ptr().cast(),
                    b.len(),
                    &mut v,
                    &mut err,
                ),
                err,
            )?
        };
        Ok(v)
    }

    /// Reads and checks a sketch's header.
    pub fn read_header(bytes: &[u8]) -> Result<SketchHeader> {
        unsafe {
            let mut h: sys::specinfer_sketch_header = std::mem::zeroed();
            h.struct_size = std::mem::size_of::<sys::specinfer_sketch_header>() as u32;
            let mut err = ptr::null_mut();
            check_msg(sys::specinfer_sketch_read_header(bytes.as_ptr().cast(), bytes.len(), &mut h, &mut err), err)?;
            if h.kind.is_null() {
                return Err(Error::new(Code::Format, "sketch header without a kind"));
            }
            Ok(SketchHeader {
                kind: cstr(h.kind),
                is_query: h.is_query != 0,
                dim: h.dim,
                size: h.size,
                count: h.count,
                n_bytes: h.n_bytes,
            })
        }
    }
}

impl Drop for Sketcher {
    fn drop(&mut self) {
        unsafe { sys::specinfer_sketcher_destroy(self.ptr) };
        live_dec();
    }
}
