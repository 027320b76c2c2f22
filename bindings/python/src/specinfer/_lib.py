"""ctypes declarations of the specinfer C ABI (abi/specinfer.h, abi/specinfer_plugin.h)."""

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_uint32, c_uint64, c_void_p)

PLUGIN_ABI_VERSION = 1
DRAFTER_FACTORY_ID = b"specinfer.drafter-factory/1"
SKETCH_QUERY = 1


def _candidates():
    env = os.environ.get("SPECINFER_LIBRARY")
    if env:
        yield env
    if shutil.which("pkg-config"):
        try:
            libdir = subprocess.run(["pkg-config", "--variable=libdir", "specinfer"], capture_output=True,
                                    text=True, check=True).stdout.strip()
            if libdir:
                yield os.path.join(libdir, "libspecinfer.so.0")
                yield os.path.join(libdir, "libspecinfer.so")
        except (OSError, subprocess.CalledProcessError):
            pass
    found = ctypes.util.find_library("specinfer")
    if found:
        yield found
    yield "libspecinfer.so.0"


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "specinfer: cannot load the C library libspecinfer.so. Install it (cmake --install build) and "
        "set PKG_CONFIG_PATH=<prefix>/lib/pkgconfig, or LD_LIBRARY_PATH=<prefix>/lib, or "
        "SPECINFER_LIBRARY=<path of libspecinfer.so>. Tried: " + "; ".join(errors))


lib = _load()


class RegistryParams(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_threads", c_int32), ("load_builtin", c_int32),
                ("log", c_void_p), ("log_user", c_void_p), ("log_level", c_int)]


class PluginInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("name", c_char_p), ("version", c_char_p),
                ("description", c_char_p), ("path", c_char_p), ("has_target", c_int32),
                ("has_drafter", c_int32), ("abi_version", c_uint32)]


class ModelInfoC(Structure):
    _fields_ = [("struct_size", c_uint32), ("vocab_size", c_int32), ("n_ctx", c_int32),
                ("hidden_size", c_int32), ("bos_token", c_int32), ("eos_token", c_int32),
                ("eot_token", c_int32), ("add_bos", c_int32), ("name", c_char_p), ("arch", c_char_p),
                ("eog_tokens", POINTER(c_int32)), ("n_eog_tokens", c_int32),
                ("chat_template", c_char_p)]


class SessionParamsC(Structure):
    _fields_ = [("struct_size", c_uint32), ("max_draft", c_int32), ("adaptive_draft", c_int32),
                ("temperature", c_float), ("top_k", c_int32), ("top_p", c_float), ("min_p", c_float),
                ("seed", c_uint64), ("context_shift", c_int32), ("n_keep", c_int32)]


class SessionStats(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_prompt_tokens", c_int64), ("n_generated", c_int64),
                ("n_rounds", c_int64), ("n_target_passes", c_int64), ("n_drafted", c_int64),
                ("n_accepted", c_int64), ("acceptance_rate", c_double), ("mean_accepted", c_double),
                ("t_prefill_ms", c_double), ("t_draft_ms", c_double), ("t_verify_ms", c_double),
                ("t_sample_ms", c_double), ("t_total_ms", c_double), ("tokens_per_second", c_double),
                ("n_context_shifts", c_int64), ("n_forced_drafted", c_int64),
                ("n_forced_accepted", c_int64), ("t_constraint_ms", c_double),
                ("n_cached_tokens", c_int64), ("n_estimated_rounds", c_int64),
                ("expected_accepted", c_double), ("estimated_rounds_accepted", c_double)]


class StepResultC(Structure):
    _fields_ = [("struct_size", c_uint32), ("tokens", POINTER(c_int32)), ("cap", c_size_t), ("n_tokens", c_size_t),
                ("done", c_int32), ("status", c_int)]


class StepParamsC(Structure):
    _fields_ = [("struct_size", c_uint32), ("prefill_chunk", c_int32)]


class SketcherInfoC(Structure):
    _fields_ = [("struct_size", c_uint32), ("kind", c_char_p), ("dim", c_int64), ("size", c_int64),
                ("seed", c_uint64), ("key_bytes", c_size_t), ("query_bytes", c_size_t),
                ("fixed_size", c_int32), ("linear", c_int32), ("simd", c_char_p)]


class PluginError(Structure):
    _fields_ = [("message", c_char * 512)]


class TrainProgressC(Structure):
    _fields_ = [("struct_size", c_uint32), ("stage", c_char_p), ("done", c_int64), ("total", c_int64),
                ("loss", c_double), ("n_heads", c_int32), ("accuracy", POINTER(c_float))]


TRAIN_PROGRESS_FN = CFUNCTYPE(c_int, c_void_p, POINTER(TrainProgressC))


class TrainParamsC(Structure):
    _fields_ = [("struct_size", c_uint32), ("config", c_char_p), ("corpus", POINTER(c_char_p)),
                ("n_corpus", c_int32), ("out_path", c_char_p), ("progress", TRAIN_PROGRESS_FN),
                ("user", c_void_p)]


TOKEN_FN = CFUNCTYPE(c_int, c_void_p, POINTER(c_int32), c_size_t, POINTER(c_char), c_size_t)
DRAFT_SAMPLE_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(c_float), c_int32, c_int64)


class DraftRequestC(Structure):
    # The fields after sample_ctx were added later: read them only when struct_size covers them.
    _fields_ = [("struct_size", c_uint32), ("max_tokens", c_int32), ("allow_tree", c_int32),
                ("context", POINTER(c_int32)), ("n_context", c_size_t), ("temperature", c_float),
                ("seed", c_uint64), ("sample", DRAFT_SAMPLE_FN), ("sample_ctx", c_void_p),
                ("hidden", POINTER(c_float)), ("hidden_size", c_int32), ("hidden_position", c_int64),
                ("pass_cost", POINTER(c_float)), ("n_pass_cost", c_int32)]


class DraftC(Structure):
    _fields_ = [("struct_size", c_uint32), ("cap", c_int32), ("vocab_size", c_int32), ("n_nodes", c_int32),
                ("tokens", POINTER(c_int32)), ("parents", POINTER(c_int32)), ("probs", POINTER(c_float)),
                ("has_probs", c_int32), ("expected_accepted", c_double)]


DESTROY_FN = CFUNCTYPE(None, c_void_p)
BEGIN_FN = CFUNCTYPE(c_int, c_void_p, POINTER(c_int32), c_size_t, POINTER(PluginError))
PROPOSE_FN = CFUNCTYPE(c_int, c_void_p, POINTER(DraftRequestC), POINTER(DraftC), POINTER(PluginError))
COMMIT_FN = CFUNCTYPE(c_int, c_void_p, POINTER(c_int32), c_size_t, POINTER(PluginError))


class DrafterVtable(Structure):
    # propose_many (drafts for several drafters in one call) is left NULL: the host calls propose.
    _fields_ = [("struct_size", c_uint32), ("destroy", DESTROY_FN), ("begin", BEGIN_FN),
                ("propose", PROPOSE_FN), ("commit", COMMIT_FN), ("propose_many", c_void_p)]


# create(host, config, target_info, target, self**, vtable**, err)
CREATE_FN = CFUNCTYPE(c_int, c_void_p, c_char_p, POINTER(ModelInfoC), c_void_p, POINTER(c_void_p),
                      POINTER(c_void_p), POINTER(PluginError))


# train(host, params, target_info, target, err)
TRAIN_FN = CFUNCTYPE(c_int, c_void_p, POINTER(TrainParamsC), POINTER(ModelInfoC), c_void_p, POINTER(PluginError))


class DrafterFactoryC(Structure):
    _fields_ = [("struct_size", c_uint32), ("create", CREATE_FN), ("train", TRAIN_FN)]


GET_FACTORY_FN = CFUNCTYPE(c_void_p, c_char_p)


class PluginDescriptor(Structure):
    _fields_ = [("abi_version", c_uint32), ("struct_size", c_uint32), ("name", c_char_p),
                ("version", c_char_p), ("description", c_char_p), ("init", c_void_p),
                ("deinit", c_void_p), ("get_factory", GET_FACTORY_FN)]


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


P = c_void_p
# char **errmsg is declared POINTER(c_void_p): the message is read, then freed with specinfer_free.
_fn("specinfer_version_string", c_char_p)
_fn("specinfer_version_number", c_int)
_fn("specinfer_status_str", c_char_p, c_int)
_fn("specinfer_free", None, c_void_p)
_fn("specinfer_registry_params_init", None, POINTER(RegistryParams))
_fn("specinfer_registry_create", c_int, POINTER(RegistryParams), POINTER(P), POINTER(c_void_p))
_fn("specinfer_registry_destroy", c_int, P)
_fn("specinfer_registry_plugin_path", c_char_p, P)
_fn("specinfer_registry_load_plugin", c_int, P, c_char_p, POINTER(c_void_p))
_fn("specinfer_registry_register_plugin", c_int, P, POINTER(PluginDescriptor), POINTER(c_void_p))
_fn("specinfer_registry_unload_plugin", c_int, P, c_char_p, POINTER(c_void_p))
_fn("specinfer_registry_plugin_count", c_int32, P)
_fn("specinfer_registry_plugin_info", c_int, P, c_int32, POINTER(PluginInfo))
_fn("specinfer_registry_threads", c_int32, P)
_fn("specinfer_target_open", c_int, P, c_char_p, c_char_p, POINTER(P), POINTER(c_void_p))
_fn("specinfer_target_share", c_int, P, POINTER(P), POINTER(c_void_p))
_fn("specinfer_target_destroy", c_int, P)
_fn("specinfer_target_errmsg", c_char_p, P)
_fn("specinfer_model_info_init", None, POINTER(ModelInfoC))
_fn("specinfer_target_info", c_int, P, POINTER(ModelInfoC))
_fn("specinfer_target_tokenize", c_int, P, c_char_p, c_size_t, c_int32, c_int32, POINTER(c_int32), c_size_t,
    POINTER(c_size_t))
_fn("specinfer_target_detokenize", c_int, P, POINTER(c_int32), c_size_t, POINTER(c_char), c_size_t,
    POINTER(c_size_t))
_fn("specinfer_drafter_open", c_int, P, c_char_p, c_char_p, P, POINTER(P), POINTER(c_void_p))
_fn("specinfer_drafter_destroy", c_int, P)
_fn("specinfer_train_params_init", None, POINTER(TrainParamsC))
_fn("specinfer_drafter_train", c_int, P, c_char_p, P, POINTER(TrainParamsC), POINTER(c_void_p))
_fn("specinfer_coupler_create", c_int, c_char_p, POINTER(P), POINTER(c_void_p))
_fn("specinfer_coupler_destroy", None, P)
_fn("specinfer_coupler_name", c_char_p, P)
_fn("specinfer_coupler_is_exact", c_int32, P)
_fn("specinfer_coupler_verify", c_int, P, c_int32, c_int32, POINTER(c_float), c_size_t, POINTER(c_float),
    c_size_t, POINTER(c_int32), c_uint64, c_int64, POINTER(c_int32), POINTER(c_int32), POINTER(c_void_p))
_fn("specinfer_session_params_init", None, POINTER(SessionParamsC))
_fn("specinfer_session_create", c_int, P, P, P, POINTER(SessionParamsC), POINTER(P), POINTER(c_void_p))
_fn("specinfer_session_destroy", None, P)
_fn("specinfer_session_errmsg", c_char_p, P)
_fn("specinfer_session_feed_text", c_int, P, c_char_p, c_size_t)
_fn("specinfer_session_feed_tokens", c_int, P, POINTER(c_int32), c_size_t)
_fn("specinfer_session_feed_from", c_int, P, P, c_size_t)
_fn("specinfer_session_generate", c_int, P, c_int32, TOKEN_FN, c_void_p)
_fn("specinfer_session_step", c_int, P, POINTER(c_int32), c_size_t, POINTER(c_size_t), POINTER(c_int32))
_fn("specinfer_step_params_init", None, POINTER(StepParamsC))
_fn("specinfer_session_step_many", c_int, POINTER(P), POINTER(StepResultC), c_size_t, POINTER(StepParamsC))
_fn("specinfer_session_stats_init", None, POINTER(SessionStats))
_fn("specinfer_session_get_stats", c_int, P, POINTER(SessionStats))
_fn("specinfer_session_reset", c_int, P)
_fn("specinfer_session_tokens", c_int, P, POINTER(POINTER(c_int32)), POINTER(c_size_t))
_fn("specinfer_session_step_text", c_int, P, POINTER(c_void_p), POINTER(c_size_t))
_fn("specinfer_session_set_stop_strings", c_int, P, POINTER(c_char_p), c_size_t)
_fn("specinfer_session_end_text", c_int, P, POINTER(c_void_p), POINTER(c_size_t))
_fn("specinfer_session_set_logprobs", c_int, P, c_int32)
_fn("specinfer_session_step_logprobs", c_int, P, POINTER(POINTER(c_int32)), POINTER(POINTER(c_float)),
    POINTER(POINTER(c_int32)), POINTER(POINTER(c_float)), POINTER(c_size_t), POINTER(c_int32))
_fn("specinfer_session_set_prompt_logprobs", c_int, P, c_int32)
_fn("specinfer_session_prompt_logprobs", c_int, P, POINTER(POINTER(c_int32)), POINTER(POINTER(c_float)),
    POINTER(POINTER(c_int32)), POINTER(POINTER(c_float)), POINTER(c_size_t), POINTER(c_int32))
_fn("specinfer_constraint_open", c_int, P, c_char_p, c_char_p, P, c_char_p, c_char_p, POINTER(P),
    POINTER(c_void_p))
_fn("specinfer_constraint_fork", c_int, P, POINTER(P), POINTER(c_void_p))
_fn("specinfer_constraint_destroy", c_int, P)
_fn("specinfer_constraint_errmsg", c_char_p, P)
_fn("specinfer_session_set_constraint", c_int, P, P)
_fn("specinfer_sketcher_create", c_int, c_char_p, c_int64, c_int64, c_uint64, c_char_p, POINTER(P),
    POINTER(c_void_p))
_fn("specinfer_sketcher_destroy", None, P)
_fn("specinfer_sketcher_get_info", c_int, P, POINTER(SketcherInfoC))
_fn("specinfer_sketcher_sketch", c_int, P, POINTER(c_float), c_size_t, c_int32, c_void_p, c_size_t,
    POINTER(c_size_t), POINTER(c_void_p))
_fn("specinfer_sketcher_estimate", c_int, P, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_double),
    POINTER(c_void_p))

__all__ = ["lib"]
