//! Raw declarations of the specinfer C ABI, written by hand from `abi/specinfer.h` and
//! `abi/specinfer_plugin.h`. `tests/header.rs` checks every function name, its number of
//! parameters and the enum values against the installed headers, and the struct sizes against
//! what the library's `*_init` functions write into `struct_size`.
//!
//! Everything here is `unsafe` to call; the `specinfer` crate is the safe wrapper.
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

use std::os::raw::{c_char, c_int, c_void};

// ---- versions ----

pub const SPECINFER_VERSION_MAJOR: u32 = 0;
pub const SPECINFER_VERSION_MINOR: u32 = 1;
pub const SPECINFER_VERSION_PATCH: u32 = 0;
pub const SPECINFER_VERSION_NUMBER: i32 = 1000;
pub const SPECINFER_PLUGIN_ABI_VERSION: u32 = 1;
pub const SPECINFER_TARGET_FACTORY_ID: &[u8] = b"specinfer.target-factory/1\0";
pub const SPECINFER_DRAFTER_FACTORY_ID: &[u8] = b"specinfer.drafter-factory/1\0";
pub const SPECINFER_CONSTRAINT_FACTORY_ID: &[u8] = b"specinfer.constraint-factory/1\0";
pub const SPECINFER_SKETCH_QUERY: i32 = 1;
pub const SPECINFER_MAX_TOP_LOGPROBS: i32 = 20;

// ---- status codes ----

pub type specinfer_status = c_int;
pub const SPECINFER_OK: specinfer_status = 0;
pub const SPECINFER_ERR_INVALID_ARGUMENT: specinfer_status = 1;
pub const SPECINFER_ERR_OUT_OF_MEMORY: specinfer_status = 2;
pub const SPECINFER_ERR_NOT_FOUND: specinfer_status = 3;
pub const SPECINFER_ERR_IO: specinfer_status = 4;
pub const SPECINFER_ERR_FORMAT: specinfer_status = 5;
pub const SPECINFER_ERR_ABI_MISMATCH: specinfer_status = 6;
pub const SPECINFER_ERR_UNSUPPORTED: specinfer_status = 7;
pub const SPECINFER_ERR_CONFIG: specinfer_status = 8;
pub const SPECINFER_ERR_STATE: specinfer_status = 9;
pub const SPECINFER_ERR_CANCELLED: specinfer_status = 10;
pub const SPECINFER_ERR_PLUGIN: specinfer_status = 11;
pub const SPECINFER_ERR_CONTEXT_FULL: specinfer_status = 12;
pub const SPECINFER_ERR_BUFFER_TOO_SMALL: specinfer_status = 13;
pub const SPECINFER_ERR_INTERNAL: specinfer_status = 14;

/// Every status name with its value, in header order (checked against the header by a test).
pub const STATUS_VALUES: &[(&str, specinfer_status)] = &[
    ("SPECINFER_OK", SPECINFER_OK),
    ("SPECINFER_ERR_INVALID_ARGUMENT", SPECINFER_ERR_INVALID_ARGUMENT),
    ("SPECINFER_ERR_OUT_OF_MEMORY", SPECINFER_ERR_OUT_OF_MEMORY),
    ("SPECINFER_ERR_NOT_FOUND", SPECINFER_ERR_NOT_FOUND),
    ("SPECINFER_ERR_IO", SPECINFER_ERR_IO),
    ("SPECINFER_ERR_FORMAT", SPECINFER_ERR_FORMAT),
    ("SPECINFER_ERR_ABI_MISMATCH", SPECINFER_ERR_ABI_MISMATCH),
    ("SPECINFER_ERR_UNSUPPORTED", SPECINFER_ERR_UNSUPPORTED),
    ("SPECINFER_ERR_CONFIG", SPECINFER_ERR_CONFIG),
    ("SPECINFER_ERR_STATE", SPECINFER_ERR_STATE),
    ("SPECINFER_ERR_CANCELLED", SPECINFER_ERR_CANCELLED),
    ("SPECINFER_ERR_PLUGIN", SPECINFER_ERR_PLUGIN),
    ("SPECINFER_ERR_CONTEXT_FULL", SPECINFER_ERR_CONTEXT_FULL),
    ("SPECINFER_ERR_BUFFER_TOO_SMALL", SPECINFER_ERR_BUFFER_TOO_SMALL),
    ("SPECINFER_ERR_INTERNAL", SPECINFER_ERR_INTERNAL),
];

// ---- logging ----

pub type specinfer_log_level = c_int;
pub const SPECINFER_LOG_DEBUG: specinfer_log_level = 0;
pub const SPECINFER_LOG_INFO: specinfer_log_level = 1;
pub const SPECINFER_LOG_WARN: specinfer_log_level = 2;
pub const SPECINFER_LOG_ERROR: specinfer_log_level = 3;
pub const SPECINFER_LOG_NONE: specinfer_log_level = 4;

pub type specinfer_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: specinfer_log_level, message: *const c_char)>;

// ---- opaque handles ----

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            _not_send: std::marker::PhantomData<(*mut u8, std::marker::PhantomPinned)>,
        }
    )*};
}
opaque!(
    specinfer_registry,
    specinfer_target,
    specinfer_drafter,
    specinfer_coupler,
    specinfer_session,
    specinfer_sketcher,
    specinfer_constraint
);

// ---- structs of specinfer.h ----

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_registry_params {
    pub struct_size: u32,
    pub n_threads: i32,
    pub load_builtin: i32,
    pub log: specinfer_log_fn,
    pub log_user: *mut c_void,
    pub log_level: specinfer_log_level,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_plugin_info {
    pub struct_size: u32,
    pub name: *const c_char,
    pub version: *const c_char,
    pub description: *const c_char,
    pub path: *const c_char,
    pub has_target: i32,
    pub has_drafter: i32,
    pub abi_version: u32,
    pub has_constraint: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_model_info {
    pub struct_size: u32,
    pub vocab_size: i32,
    pub n_ctx: i32,
    pub hidden_size: i32,
    pub bos_token: i32,
    pub eos_token: i32,
    pub eot_token: i32,
    pub add_bos: i32,
    pub name: *const c_char,
    pub arch: *const c_char,
    pub eog_tokens: *const i32,
    pub n_eog_tokens: i32,
    pub chat_template: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_sampling_params {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_session_params {
    pub struct_size: u32,
    pub max_draft: i32,
    pub adaptive_draft: i32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
    pub context_shift: i32,
    pub n_keep: i32,
}

/// One session's part of `specinfer_session_step_many`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_step_result {
    pub struct_size: u32,
    pub tokens: *mut i32,
    pub cap: usize,
    pub n_tokens: usize,
    pub done: i32,
    pub status: specinfer_status,
}

/// One layer's queries and keys during a pass (see `specinfer_eval_params::qk_observer`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_qk_view {
    pub struct_size: u32,
    pub layer: i32,
    pub n_layer: i32,
    pub n_tokens: i32,
    pub first_pos: i32,
    pub n_head: i32,
    pub n_head_kv: i32,
    pub head_dim: i32,
    pub window: i32,
    pub q: *const f32,
    pub k: *const f32,
}

pub type specinfer_qk_observer = Option<unsafe extern "C" fn(ctx: *mut c_void, view: *const specinfer_qk_view)>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_eval_params {
    pub struct_size: u32,
    pub tokens: *const i32,
    pub n_tokens: usize,
    pub n_past: i32,
    pub n_logits: i32,
    pub logits: *mut f32,
    pub qk_observer: specinfer_qk_observer,
    pub qk_ctx: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct specinfer_step_params {
    pub struct_size: u32,
    pub prefill_chunk: i32,
}

pub type specinfer_token_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        tokens: *const i32,
        n_tokens: usize,
        text: *const c_char,
        text_len: usize,
    ) -> c_int,
>;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct specinfer_session_stats {
    pub struct_size: u32,
    pub n_prompt_tokens: i64,
    pub n_generated: i64,
    pub n_rounds: i64,
    pub n_target_passes: i64,
    pub n_drafted: i64,
    pub n_accepted: i64,
    pub acceptance_rate: f64,
    pub mean_accepted: f64,
    pub t_prefill_ms: f64,
    pub t_draft_ms: f64,
    pub t_verify_ms: f64,
    pub t_sample_ms: f64,
    pub t_total_ms: f64,
    pub tokens_per_second: f64,
    pub n_context_shifts: i64,
    pub n_forced_drafted: i64,
    pub n_forced_accepted: i64,
    pub t_constraint_ms: f64,
    pub n_cached_tokens: i64,
    pub n_estimated_rounds: i64,
    pub expected_accepted: f64,
    pub estimated_rounds_accepted: f64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct specinfer_round_info {
    pub struct_size: u32,
    pub n_sessions: i32,
    pub n_pass_tokens: i32,
    pub draft_budget: i32,
    pub n_drafted: i32,
    pub n_accepted: i32,
    pub draft_ms: f64,
    pub pass_ms: f64,
    pub predicted_pass_ms: f64,
    pub goodput: f64,
    pub plain_goodput: f64,
    pub expected_accepted: f64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_sketcher_info {
    pub struct_size: u32,
    pub kind: *const c_char,
    pub dim: i64,
    pub size: i64,
    pub seed: u64,
    pub key_bytes: usize,
    pub query_bytes: usize,
    pub fixed_size: i32,
    pub linear: i32,
    pub simd: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_sketch_header {
    pub struct_size: u32,
    pub kind: *const c_char,
    pub is_query: i32,
    pub dim: i64,
    pub size: i64,
    pub count: i64,
    pub n_bytes: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_train_progress {
    pub struct_size: u32,
    pub stage: *const c_char,
    pub done: i64,
    pub total: i64,
    pub loss: f64,
    pub n_heads: i32,
    pub accuracy: *const f32,
}

pub type specinfer_train_progress_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, progress: *const specinfer_train_progress) -> c_int>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_train_params {
    pub struct_size: u32,
    pub config: *const c_char,
    pub corpus: *const *const c_char,
    pub n_corpus: i32,
    pub out_path: *const c_char,
    pub progress: specinfer_train_progress_fn,
    pub user: *mut c_void,
}

// ---- structs of specinfer_plugin.h ----

#[repr(C)]
pub struct specinfer_plugin_error {
    pub message: [c_char; 512],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_attention_args {
    pub struct_size: u32,
    pub n_q: i32,
    pub n_head: i32,
    pub n_head_kv: i32,
    pub head_dim: i32,
    pub n_kv: i32,
    pub q: *const f32,
    pub k: *const f32,
    pub v: *const f32,
    pub mask: *const u8,
    pub scale: f32,
    pub out: *mut f32,
    pub k_type: i32,
    pub v_type: i32,
    pub k_sketch: *const u8,
    pub sketch_bits: i32,
    pub n_select: i32,
    pub n_window: i32,
    pub n_sink: i32,
    pub k_pos_stride: i64,
    pub k_head_stride: i64,
    pub v_pos_stride: i64,
    pub v_head_stride: i64,
    pub k_tile: i32,
    pub n_rescore: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_kernels {
    pub struct_size: u32,
    pub row_size: Option<unsafe extern "C" fn(wtype: i32, n_cols: i64) -> usize>,
    pub block_size: Option<unsafe extern "C" fn(wtype: i32) -> i64>,
    pub dequantize_row:
        Option<unsafe extern "C" fn(wtype: i32, src: *const c_void, dst: *mut f32, n: i64) -> specinfer_status>,
    pub matmul: Option<
        unsafe extern "C" fn(
            wtype: i32,
            w: *const c_void,
            n_rows: i64,
            n_cols: i64,
            x: *const f32,
            n_tok: i64,
            y: *mut f32,
        ) -> specinfer_status,
    >,
    pub rmsnorm: Option<unsafe extern "C" fn(x: *const f32, w: *const f32, n: i64, eps: f32, y: *mut f32)>,
    pub rope: Option<
        unsafe extern "C" fn(x: *mut f32, n_heads: i64, head_dim: i64, n_rot: i64, pos: i64, freq_base: f32, neox: i32),
    >,
    pub softmax: Option<unsafe extern "C" fn(x: *mut f32, n: i64)>,
    pub attention: Option<unsafe extern "C" fn(args: *const specinfer_attention_args) -> specinfer_status>,
    pub silu_mul: Option<unsafe extern "C" fn(gate: *mut f32, up: *const f32, n: i64)>,
    pub add: Option<unsafe extern "C" fn(y: *mut f32, x: *const f32, n: i64)>,
    pub isa: Option<unsafe extern "C" fn() -> *const c_char>,
    pub pack_weight: Option<
        unsafe extern "C" fn(
            wtype: i32,
            w: *const c_void,
            n_rows: i64,
            n_cols: i64,
            out: *mut *mut specinfer_packed_weight,
        ) -> specinfer_status,
    >,
    pub matmul_packed: Option<
        unsafe extern "C" fn(
            pw: *const specinfer_packed_weight,
            x: *const f32,
            n_tok: i64,
            y: *mut f32,
        ) -> specinfer_status,
    >,
    pub free_packed: Option<unsafe extern "C" fn(pw: *mut specinfer_packed_weight)>,
    pub quantize_row:
        Option<unsafe extern "C" fn(wtype: i32, src: *const f32, dst: *mut c_void, n: i64) -> specinfer_status>,
    pub packed_bytes: Option<unsafe extern "C" fn(pw: *const specinfer_packed_weight) -> usize>,
    pub kv_store:
        Option<unsafe extern "C" fn(wtype: i32, src: *const f32, dst: *mut c_void, n: i64) -> specinfer_status>,
    pub rope_freqs: Option<
        unsafe extern "C" fn(
            x: *mut f32,
            n_heads: i64,
            head_dim: i64,
            n_rot: i64,
            pos: i64,
            inv_freq: *const f64,
            mscale: f32,
            neox: i32,
        ),
    >,
    pub key_sketch: Option<
        unsafe extern "C" fn(
            k: *const f32,
            n_rows: i64,
            head_dim: i64,
            bits: i32,
            dst: *mut c_void,
        ) -> specinfer_status,
    >,
    pub attention_features: u32,
}

/// Bit of `specinfer_kernels::attention_features`: attention reads the row strides.
pub const SPECINFER_ATTN_STRIDES: u32 = 1;
/// Bit of `specinfer_kernels::attention_features`: attention reads `k_tile`.
pub const SPECINFER_ATTN_KEY_TILES: u32 = 2;
/// Bit of `specinfer_kernels::attention_features`: attention reads `n_rescore`.
pub const SPECINFER_ATTN_RESCORE: u32 = 4;
/// Positions per key tile (`specinfer_attention_args::k_tile`).
pub const SPECINFER_KEY_TILE: i32 = 16;

// Opaque: a weight matrix prepared by `pack_weight`.
opaque!(specinfer_packed_weight);

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_forward_batch {
    pub struct_size: u32,
    pub n_tokens: i32,
    pub tokens: *const i32,
    pub positions: *const i32,
    pub tree_mask: *const u8,
    pub n_logits: i32,
    pub logits: *mut f32,
    pub hidden: *mut f32,
    pub qk_observer: specinfer_qk_observer,
    pub qk_ctx: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_target_vtable {
    pub struct_size: u32,
    pub destroy: Option<unsafe extern "C" fn(this: *mut c_void)>,
    pub info: Option<unsafe extern "C" fn(this: *mut c_void, info: *mut specinfer_model_info) -> specinfer_status>,
    pub tokenize: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            text: *const c_char,
            len: usize,
            add_special: i32,
            parse_special: i32,
            tokens: *mut i32,
            cap: usize,
            n_tokens: *mut usize,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub token_bytes: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            token: i32,
            buf: *mut c_char,
            cap: usize,
            n_bytes: *mut usize,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub forward: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            batch: *const specinfer_forward_batch,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub kv_size: Option<unsafe extern "C" fn(this: *mut c_void) -> i32>,
    pub kv_truncate: Option<
        unsafe extern "C" fn(this: *mut c_void, n_keep: i32, err: *mut specinfer_plugin_error) -> specinfer_status,
    >,
    pub kv_keep: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            base: i32,
            idx: *const i32,
            n: i32,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    // Added after kv_keep: check struct_size; may be NULL.
    pub output_rows: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            ids: *const i32,
            n: i32,
            out: *mut f32,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    // Added after output_rows: check struct_size; either may be NULL.
    pub share: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            out: *mut *mut c_void,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub forward_many: Option<
        unsafe extern "C" fn(
            selves: *const *mut c_void,
            batches: *const specinfer_forward_batch,
            n: i32,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    // Added after forward_many: check struct_size; may be NULL.
    pub kv_copy: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            src: *mut c_void,
            n: i32,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_target_factory {
    pub struct_size: u32,
    pub create: Option<
        unsafe extern "C" fn(
            host: *const specinfer_host,
            config: *const c_char,
            this: *mut *mut c_void,
            vtable: *mut *const specinfer_target_vtable,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_host_target {
    pub this: *mut c_void,
    pub vtable: *const specinfer_target_vtable,
    pub host_handle: *mut c_void,
}

pub type specinfer_draft_sample_fn =
    Option<unsafe extern "C" fn(ctx: *const c_void, q: *const f32, vocab: i32, position: i64) -> i32>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_draft_request {
    pub struct_size: u32,
    pub max_tokens: i32,
    pub allow_tree: i32,
    pub context: *const i32,
    pub n_context: usize,
    pub temperature: f32,
    pub seed: u64,
    pub sample: specinfer_draft_sample_fn,
    pub sample_ctx: *const c_void,
    // Added after sample_ctx: read only when struct_size covers them.
    pub hidden: *const f32,
    pub hidden_size: i32,
    pub hidden_position: i64,
    pub pass_cost: *const f32,
    pub n_pass_cost: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_draft {
    pub struct_size: u32,
    pub cap: i32,
    pub vocab_size: i32,
    pub n_nodes: i32,
    pub tokens: *mut i32,
    pub parents: *mut i32,
    pub probs: *mut f32,
    pub has_probs: i32,
    pub expected_accepted: f64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_drafter_vtable {
    pub struct_size: u32,
    pub destroy: Option<unsafe extern "C" fn(this: *mut c_void)>,
    pub begin: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            context: *const i32,
            n: usize,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub propose: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            req: *const specinfer_draft_request,
            out: *mut specinfer_draft,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub commit: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            tokens: *const i32,
            n: usize,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub propose_many: Option<
        unsafe extern "C" fn(
            selves: *const *mut c_void,
            reqs: *const specinfer_draft_request,
            outs: *mut specinfer_draft,
            n: i32,
            status: *mut specinfer_status,
            errs: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_drafter_factory {
    pub struct_size: u32,
    pub create: Option<
        unsafe extern "C" fn(
            host: *const specinfer_host,
            config: *const c_char,
            target_info: *const specinfer_model_info,
            target: *const specinfer_host_target,
            this: *mut *mut c_void,
            vtable: *mut *const specinfer_drafter_vtable,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    // Added after create: check struct_size; None = the drafter needs no training.
    pub train: Option<
        unsafe extern "C" fn(
            host: *const specinfer_host,
            params: *const specinfer_train_params,
            target_info: *const specinfer_model_info,
            target: *const specinfer_host_target,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
}

pub const SPECINFER_CONSTRAINT_ACCEPTING: u32 = 1;
pub const SPECINFER_CONSTRAINT_STOPPED: u32 = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct specinfer_constraint_vtable {
    pub struct_size: u32,
    pub destroy: Option<unsafe extern "C" fn(this: *mut c_void)>,
    pub mask: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            mask: *mut u32,
            n_words: i32,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub consume: Option<
        unsafe extern "C" fn(this: *mut c_void, token: i32, err: *mut specinfer_plugin_error) -> specinfer_status,
    >,
    pub rollback:
        Option<unsafe extern "C" fn(this: *mut c_void, n: i32, err: *mut specinfer_plugin_error) -> specinfer_status>,
    pub fork: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            out: *mut *mut c_void,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub forced: Option<
        unsafe extern "C" fn(
            this: *mut c_void,
            tokens: *mut i32,
            cap: i32,
            n: *mut i32,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub state: Option<
        unsafe extern "C" fn(this: *mut c_void, state: *mut u32, err: *mut specinfer_plugin_error) -> specinfer_status,
    >,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_constraint_factory {
    pub struct_size: u32,
    pub create: Option<
        unsafe extern "C" fn(
            host: *const specinfer_host,
            config: *const c_char,
            target_info: *const specinfer_model_info,
            target: *const specinfer_host_target,
            kind: *const c_char,
            grammar: *const c_char,
            this: *mut *mut c_void,
            vtable: *mut *const specinfer_constraint_vtable,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
}

#[repr(C)]
pub struct specinfer_host {
    pub struct_size: u32,
    pub abi_version: u32,
    pub host_data: *mut c_void,
    pub log: Option<unsafe extern "C" fn(host: *const specinfer_host, level: i32, message: *const c_char)>,
    pub alloc: Option<unsafe extern "C" fn(size: usize, align: usize) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(ptr: *mut c_void)>,
    pub parallel_for: Option<
        unsafe extern "C" fn(
            host: *const specinfer_host,
            n: i64,
            grain: i64,
            f: Option<unsafe extern "C" fn(ctx: *mut c_void, begin: i64, end: i64)>,
            ctx: *mut c_void,
        ),
    >,
    pub n_threads: i32,
    pub kernels: *const specinfer_kernels,
    pub open_target: Option<
        unsafe extern "C" fn(
            host: *const specinfer_host,
            plugin: *const c_char,
            config: *const c_char,
            out: *mut specinfer_host_target,
            err: *mut specinfer_plugin_error,
        ) -> specinfer_status,
    >,
    pub close_target: Option<unsafe extern "C" fn(host: *const specinfer_host, target: *mut specinfer_host_target)>,
    pub features: u32,
}

/// Bit of `specinfer_host::features`: `kv_truncate` may keep fewer positions than asked.
pub const SPECINFER_HOST_SHORT_TRUNCATE: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct specinfer_plugin_descriptor {
    pub abi_version: u32,
    pub struct_size: u32,
    pub name: *const c_char,
    pub version: *const c_char,
    pub description: *const c_char,
    pub init: Option<unsafe extern "C" fn(host: *const specinfer_host) -> i32>,
    pub deinit: Option<unsafe extern "C" fn()>,
    pub get_factory: Option<unsafe extern "C" fn(factory_id: *const c_char) -> *const c_void>,
}

// ---- functions ----

extern "C" {
    pub fn specinfer_version_number() -> c_int;
    pub fn specinfer_version_string() -> *const c_char;
    pub fn specinfer_status_str(status: c_int) -> *const c_char;
    pub fn specinfer_free(ptr: *mut c_void);

    pub fn specinfer_registry_params_init(params: *mut specinfer_registry_params);
    pub fn specinfer_registry_create(
        params: *const specinfer_registry_params,
        out: *mut *mut specinfer_registry,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_registry_destroy(registry: *mut specinfer_registry) -> specinfer_status;
    pub fn specinfer_registry_plugin_path(registry: *const specinfer_registry) -> *const c_char;
    pub fn specinfer_registry_load_plugin(
        registry: *mut specinfer_registry,
        path: *const c_char,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_registry_load_dir(
        registry: *mut specinfer_registry,
        dir: *const c_char,
        n_loaded: *mut i32,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_registry_register_plugin(
        registry: *mut specinfer_registry,
        descriptor: *const specinfer_plugin_descriptor,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_registry_unload_plugin(
        registry: *mut specinfer_registry,
        name: *const c_char,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_registry_plugin_count(registry: *const specinfer_registry) -> i32;
    pub fn specinfer_registry_plugin_info(
        registry: *const specinfer_registry,
        index: i32,
        info: *mut specinfer_plugin_info,
    ) -> specinfer_status;
    pub fn specinfer_registry_threads(registry: *const specinfer_registry) -> i32;

    pub fn specinfer_target_open(
        registry: *mut specinfer_registry,
        plugin: *const c_char,
        config: *const c_char,
        out: *mut *mut specinfer_target,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_target_share(
        target: *mut specinfer_target,
        out: *mut *mut specinfer_target,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_target_destroy(target: *mut specinfer_target) -> specinfer_status;
    pub fn specinfer_target_errmsg(target: *const specinfer_target) -> *const c_char;
    pub fn specinfer_model_info_init(info: *mut specinfer_model_info);
    pub fn specinfer_target_info(target: *mut specinfer_target, info: *mut specinfer_model_info) -> specinfer_status;
    pub fn specinfer_target_tokenize(
        target: *mut specinfer_target,
        text: *const c_char,
        len: usize,
        add_special: i32,
        parse_special: i32,
        tokens: *mut i32,
        cap: usize,
        n_tokens: *mut usize,
    ) -> specinfer_status;
    pub fn specinfer_target_detokenize(
        target: *mut specinfer_target,
        tokens: *const i32,
        n: usize,
        text: *mut c_char,
        cap: usize,
        n_bytes: *mut usize,
    ) -> specinfer_status;
    pub fn specinfer_eval_params_init(params: *mut specinfer_eval_params);
    pub fn specinfer_target_eval(
        target: *mut specinfer_target,
        params: *const specinfer_eval_params,
        n_cached: *mut i32,
    ) -> specinfer_status;

    pub fn specinfer_drafter_open(
        registry: *mut specinfer_registry,
        plugin: *const c_char,
        config: *const c_char,
        target: *mut specinfer_target,
        out: *mut *mut specinfer_drafter,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_drafter_destroy(drafter: *mut specinfer_drafter) -> specinfer_status;
    pub fn specinfer_drafter_errmsg(drafter: *const specinfer_drafter) -> *const c_char;
    pub fn specinfer_train_params_init(params: *mut specinfer_train_params);
    pub fn specinfer_drafter_train(
        registry: *mut specinfer_registry,
        plugin: *const c_char,
        target: *mut specinfer_target,
        params: *const specinfer_train_params,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;

    pub fn specinfer_coupler_create(
        spec: *const c_char,
        out: *mut *mut specinfer_coupler,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_coupler_destroy(coupler: *mut specinfer_coupler);
    pub fn specinfer_coupler_name(coupler: *const specinfer_coupler) -> *const c_char;
    pub fn specinfer_coupler_is_exact(coupler: *const specinfer_coupler) -> i32;
    pub fn specinfer_coupler_verify(
        coupler: *const specinfer_coupler,
        vocab: i32,
        k: i32,
        p: *const f32,
        p_len: usize,
        q: *const f32,
        q_len: usize,
        draft: *const i32,
        seed: u64,
        position: i64,
        n_accepted: *mut i32,
        token: *mut i32,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_coupler_draft_sample(
        coupler: *const specinfer_coupler,
        vocab: i32,
        q: *const f32,
        q_len: usize,
        seed: u64,
        position: i64,
        token: *mut i32,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_coupler_verify_tree(
        coupler: *const specinfer_coupler,
        vocab: i32,
        n_nodes: i32,
        tokens: *const i32,
        parents: *const i32,
        p: *const f32,
        p_len: usize,
        q: *const f32,
        q_len: usize,
        seed: u64,
        position: i64,
        path: *mut i32,
        path_cap: usize,
        n_accepted: *mut i32,
        token: *mut i32,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sampling_params_init(params: *mut specinfer_sampling_params);
    pub fn specinfer_sample_probs(
        logits: *const f32,
        vocab: i32,
        params: *const specinfer_sampling_params,
        probs: *mut f32,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;

    pub fn specinfer_session_params_init(params: *mut specinfer_session_params);
    pub fn specinfer_session_create(
        target: *mut specinfer_target,
        drafter: *mut specinfer_drafter,
        coupler: *const specinfer_coupler,
        params: *const specinfer_session_params,
        out: *mut *mut specinfer_session,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_session_destroy(session: *mut specinfer_session);
    pub fn specinfer_session_errmsg(session: *const specinfer_session) -> *const c_char;
    pub fn specinfer_session_feed_text(
        session: *mut specinfer_session,
        text: *const c_char,
        len: usize,
    ) -> specinfer_status;
    pub fn specinfer_session_feed_tokens(
        session: *mut specinfer_session,
        tokens: *const i32,
        n: usize,
    ) -> specinfer_status;
    pub fn specinfer_session_feed_from(
        session: *mut specinfer_session,
        src: *mut specinfer_session,
        n_tokens: usize,
    ) -> specinfer_status;
    pub fn specinfer_session_generate(
        session: *mut specinfer_session,
        max_tokens: i32,
        on_tokens: specinfer_token_fn,
        user: *mut c_void,
    ) -> specinfer_status;
    pub fn specinfer_session_step(
        session: *mut specinfer_session,
        tokens: *mut i32,
        cap: usize,
        n_tokens: *mut usize,
        done: *mut i32,
    ) -> specinfer_status;
    pub fn specinfer_step_params_init(params: *mut specinfer_step_params);
    pub fn specinfer_session_step_many(
        sessions: *const *mut specinfer_session,
        results: *mut specinfer_step_result,
        n: usize,
        params: *const specinfer_step_params,
    ) -> specinfer_status;
    pub fn specinfer_session_step_text(
        session: *const specinfer_session,
        text: *mut *const c_char,
        len: *mut usize,
    ) -> specinfer_status;
    pub fn specinfer_session_set_stop_strings(
        session: *mut specinfer_session,
        stops: *const *const c_char,
        n: usize,
    ) -> specinfer_status;
    pub fn specinfer_session_end_text(
        session: *mut specinfer_session,
        text: *mut *const c_char,
        len: *mut usize,
    ) -> specinfer_status;
    pub fn specinfer_session_set_logprobs(session: *mut specinfer_session, top_n: i32) -> specinfer_status;
    pub fn specinfer_session_step_logprobs(
        session: *const specinfer_session,
        tokens: *mut *const i32,
        logprobs: *mut *const f32,
        top_tokens: *mut *const i32,
        top_logprobs: *mut *const f32,
        n: *mut usize,
        top_n: *mut i32,
    ) -> specinfer_status;
    pub fn specinfer_session_set_prompt_logprobs(session: *mut specinfer_session, top_n: i32) -> specinfer_status;
    pub fn specinfer_session_prompt_logprobs(
        session: *const specinfer_session,
        tokens: *mut *const i32,
        logprobs: *mut *const f32,
        top_tokens: *mut *const i32,
        top_logprobs: *mut *const f32,
        n: *mut usize,
        top_n: *mut i32,
    ) -> specinfer_status;
    pub fn specinfer_session_stats_init(stats: *mut specinfer_session_stats);
    pub fn specinfer_session_get_stats(
        session: *const specinfer_session,
        stats: *mut specinfer_session_stats,
    ) -> specinfer_status;
    pub fn specinfer_round_info_init(info: *mut specinfer_round_info);
    pub fn specinfer_session_round_info(
        session: *const specinfer_session,
        info: *mut specinfer_round_info,
    ) -> specinfer_status;
    pub fn specinfer_session_reset(session: *mut specinfer_session) -> specinfer_status;
    pub fn specinfer_session_tokens(
        session: *const specinfer_session,
        tokens: *mut *const i32,
        n: *mut usize,
    ) -> specinfer_status;

    pub fn specinfer_constraint_open(
        registry: *mut specinfer_registry,
        plugin: *const c_char,
        config: *const c_char,
        target: *mut specinfer_target,
        kind: *const c_char,
        grammar: *const c_char,
        out: *mut *mut specinfer_constraint,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_constraint_fork(
        constraint: *mut specinfer_constraint,
        out: *mut *mut specinfer_constraint,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_constraint_destroy(constraint: *mut specinfer_constraint) -> specinfer_status;
    pub fn specinfer_constraint_errmsg(constraint: *const specinfer_constraint) -> *const c_char;
    pub fn specinfer_session_set_constraint(
        session: *mut specinfer_session,
        constraint: *mut specinfer_constraint,
    ) -> specinfer_status;

    pub fn specinfer_sketcher_create(
        kind: *const c_char,
        dim: i64,
        size: i64,
        seed: u64,
        options: *const c_char,
        out: *mut *mut specinfer_sketcher,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_destroy(sketcher: *mut specinfer_sketcher);
    pub fn specinfer_sketcher_get_info(
        sketcher: *const specinfer_sketcher,
        info: *mut specinfer_sketcher_info,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_sketch_bytes(
        sketcher: *const specinfer_sketcher,
        flags: i32,
        n_bytes: *mut usize,
        exact: *mut i32,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_sketch(
        sketcher: *const specinfer_sketcher,
        x: *const f32,
        n: usize,
        flags: i32,
        buf: *mut c_void,
        cap: usize,
        n_bytes: *mut usize,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_sketch_rows(
        sketcher: *const specinfer_sketcher,
        rows: *const f32,
        n_rows: usize,
        row_stride: usize,
        flags: i32,
        buf: *mut c_void,
        cap: usize,
        offsets: *mut usize,
        n_bytes: *mut usize,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_estimate(
        sketcher: *const specinfer_sketcher,
        a: *const c_void,
        a_len: usize,
        b: *const c_void,
        b_len: usize,
        estimate: *mut f64,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_estimate_many(
        sketcher: *const specinfer_sketcher,
        query: *const c_void,
        query_len: usize,
        keys: *const c_void,
        offsets: *const usize,
        n_keys: usize,
        scores: *mut f64,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sketcher_distance2(
        sketcher: *const specinfer_sketcher,
        a: *const c_void,
        a_len: usize,
        b: *const c_void,
        b_len: usize,
        distance2: *mut f64,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
    pub fn specinfer_sketch_read_header(
        bytes: *const c_void,
        len: usize,
        header: *mut specinfer_sketch_header,
        errmsg: *mut *mut c_char,
    ) -> specinfer_status;
}
