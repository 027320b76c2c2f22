//! Renders a model's Jinja chat template (the GGUF's `tokenizer.chat_template`) with MiniJinja,
//! set up as Hugging Face transformers sets up Jinja2 for chat templates: trim_blocks and
//! lstrip_blocks on, loop controls, Python string and dict methods (`.strip()`, `.items()`, ...),
//! `raise_exception(msg)` and `strftime_now(fmt)`. The C side is chat_template.h.
//! Written for Rust 1.63 (Debian 12's; see Cargo.toml).

use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, State, Value};

/// Steps a render may take: a template that loops without end fails instead of hanging.
const FUEL: u64 = 50_000_000;

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Python's methods on strings, lists and dicts (minijinja-contrib's pycompat), plus the default
/// of `dict.get(key, default)`, which pycompat 2.7 does not take.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (ValueKind::Map, "get", [key, default]) = (value.kind(), method, args) {
        let found = value.as_object().and_then(|map| map.get_value(key));
        return Ok(found.unwrap_or_else(|| default.clone()));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

fn strftime_now(format: String) -> Result<Value, Error> {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(format_utc(&format, t)))
}

/// The few strftime fields chat templates use (dates in the system prompt), in UTC.
fn format_utc(format: &str, t: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = t.div_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{:02}", day)),
            Some('m') => out.push_str(&format!("{:02}", month)),
            Some('Y') => out.push_str(&year.to_string()),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Status codes of specinfer_chat_template_render (chat_template.h).
const OK: c_int = 0;
const ERR_TEMPLATE: c_int = 1;
const ERR_RENDER: c_int = 2;
const ERR_CONTEXT: c_int = 3;
const ERR_INTERNAL: c_int = 4;

fn render(template: &str, context_json: &str) -> Result<String, (c_int, String)> {
    let context: serde_json::Value =
        serde_json::from_str(context_json).map_err(|e| (ERR_CONTEXT, e.to_string()))?;
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(python_method);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    let template = env
        .template_from_str(template)
        .map_err(|e| (ERR_TEMPLATE, describe(&e)))?;
    template
        .render(Value::from_serialize(&context))
        .map_err(|e| (ERR_RENDER, describe(&e)))
}

/// The error and its causes on one line.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Hands a string to C: malloc'd bytes plus a NUL, freed by specinfer_chat_template_free.
unsafe fn to_c(s: &str, out: *mut *mut c_char, out_len: *mut usize) {
    let p = libc_malloc(s.len() + 1) as *mut u8;
    if p.is_null() {
        *out = std::ptr::null_mut();
        *out_len = 0;
        return;
    }
    std::ptr::copy_nonoverlapping(s.as_ptr(), p, s.len());
    *p.add(s.len()) = 0;
    *out = p as *mut c_char;
    *out_len = s.len();
}

extern "C" {
    #[link_name = "malloc"]
    fn libc_malloc(size: usize) -> *mut std::ffi::c_void;
    #[link_name = "free"]
    fn libc_free(p: *mut std::ffi::c_void);
}

unsafe fn bytes<'a>(p: *const c_char, len: usize) -> Result<&'a str, (c_int, String)> {
    if p.is_null() && len > 0 {
        return Err((ERR_CONTEXT, "null pointer".into()));
    }
    let slice = if len == 0 {
        &[][..]
    } else {
        std::slice::from_raw_parts(p as *const u8, len)
    };
    std::str::from_utf8(slice).map_err(|e| (ERR_CONTEXT, format!("not UTF-8: {e}")))
}

/// See chat_template.h.
#[no_mangle]
pub unsafe extern "C" fn specinfer_chat_template_render(
    template: *const c_char,
    template_len: usize,
    context_json: *const c_char,
    context_len: usize,
    out: *mut *mut c_char,
    out_len: *mut usize,
) -> c_int {
    if out.is_null() || out_len.is_null() {
        return ERR_CONTEXT;
    }
    let result = catch_unwind(AssertUnwindSafe(|| {
        let template = bytes(template, template_len)?;
        let context = bytes(context_json, context_len)?;
        render(template, context)
    }));
    let (rc, text) = match result {
        Ok(Ok(text)) => (OK, text),
        Ok(Err((rc, message))) => (rc, message),
        Err(_) => (ERR_INTERNAL, "the template engine panicked".to_string()),
    };
    to_c(&text, out, out_len);
    rc
}

/// See chat_template.h.
#[no_mangle]
pub unsafe extern "C" fn specinfer_chat_template_free(p: *mut c_char) {
    if !p.is_null() {
        libc_free(p as *mut std::ffi::c_void);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(template: &str, context: serde_json::Value) -> String {
        render(template, &context.to_string()).unwrap()
    }

    fn fails(template: &str, context: &str) -> (c_int, String) {
        render(template, context).unwrap_err()
    }

    // The expected texts below are Jinja2's for the same template and variables.

    #[test]
    fn blocks_trimmed_and_stripped() {
        let t = "{% for m in messages %}\n  {% if m.role == 'user' %}\n  <{{ m.role }}>{{ m.content }}\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n<assistant>\n{% endif %}";
        let messages =
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]);
        let context = json!({"messages": messages, "add_generation_prompt": true});
        assert_eq!(ok(t, context), "  <user>hi\n<assistant>\n");
    }

    #[test]
    fn loop_controls() {
        let t = "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}";
        assert_eq!(ok(t, json!({"xs": [1, 2, 3, 4, 5]})), "13");
    }

    #[test]
    fn python_string_methods() {
        let t = "[{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}]{% if s.strip().startswith('hi') and not s.endswith('x') %}!{% endif %}{{ 'a,b'.split(',') | join('+') }}";
        assert_eq!(
            ok(t, json!({"s": "  hi there \n"})),
            "[hi there|hi there \n|  hi there]!a+b"
        );
    }

    #[test]
    fn python_dict_methods_in_json_order() {
        let t = "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys() | list | join }}|{{ d.get('a') }}|{{ d.get('z', 'none') }}|{{ d.get('a', 0) }}";
        assert_eq!(ok(t, json!({"d": {"b": 1, "a": 2}})), "b=1;a=2;ba|2|none|2");
    }

    #[test]
    fn functions() {
        let (rc, message) = fails("{{ raise_exception('roles must alternate') }}", "{}");
        assert_eq!(rc, ERR_RENDER);
        assert!(message.contains("roles must alternate"), "{message}");
        assert_eq!(ok("{{ strftime_now('%Y') | length }}", json!({})), "4");
    }

    #[test]
    fn errors() {
        assert_eq!(fails("{% for %}", "{}").0, ERR_TEMPLATE);
        assert_eq!(fails("{{ x }}", "{not json").0, ERR_CONTEXT);
        // A template that would loop for ever runs out of fuel instead.
        let endless =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let (rc, message) = fails(endless, "{}");
        assert_eq!(rc, ERR_RENDER);
        assert!(message.contains("fuel"), "{message}");
    }

    #[test]
    fn c_abi() {
        let (t, c) = ("{{ a }}é", r#"{"a": "x"}"#);
        let (mut out, mut len) = (std::ptr::null_mut(), 0usize);
        let rc = unsafe {
            specinfer_chat_template_render(
                t.as_ptr().cast(),
                t.len(),
                c.as_ptr().cast(),
                c.len(),
                &mut out,
                &mut len,
            )
        };
        assert_eq!(rc, OK);
        let text = unsafe { std::slice::from_raw_parts(out as *const u8, len + 1) };
        assert_eq!(text, "xé\0".as_bytes());
        unsafe { specinfer_chat_template_free(out) };
    }

    #[test]
    fn dates() {
        assert_eq!(format_utc("%d %b %Y", 0), "01 Jan 1970");
        assert_eq!(format_utc("%d %B %Y", 1_709_251_200), "01 March 2024");
    }
}
