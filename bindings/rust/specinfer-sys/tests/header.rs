//! Checks the hand-written declarations of src/lib.rs against the installed C headers:
//! every SPECINFER_API function is declared with the same number of parameters (and nothing
//! extra), every struct has the same fields in the same order with the same types (a function
//! pointer field: the same number of parameters), every function pointer typedef has the same
//! number of parameters, the status values agree, and the struct sizes agree with what the
//! library's *_init functions write into `struct_size`.

use std::collections::BTreeMap;
use std::mem::size_of;

use specinfer_sys::*;

const RUST_SRC: &str = include_str!("../src/lib.rs");

fn header(name: &str) -> String {
    let dir = env!("SPECINFER_INCLUDE_DIR");
    let path = format!("{dir}/{name}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// Removes /* */ and // comments and preprocessor lines.
fn strip_c(src: &str) -> String {
    let mut out = String::new();
    let mut rest = src;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i + 2..].find("*/").expect("unterminated comment") + i + 4;
        rest = &rest[end..];
    }
    out.push_str(rest);
    // Join continuation lines, then drop preprocessor lines and // comments.
    let joined = out.replace("\\\n", " ");
    joined
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Splits `s` at commas (or semicolons) that are not inside brackets.
fn split_top(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    let mut prev = ' ';
    for c in s.chars() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            '>' if prev == '-' => {} // a Rust return arrow
            ')' | ']' | '}' | '>' => depth -= 1,
            _ => {}
        }
        prev = c;
        if c == sep && depth == 0 {
            parts.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        parts.push(cur.trim().to_string());
    }
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The text between the bracket at `open` and its match.
fn bracketed(s: &str, open: usize) -> (&str, usize) {
    let bytes = s.as_bytes();
    let (o, c) = (bytes[open], if bytes[open] == b'(' { b')' } else { b'}' });
    let mut depth = 0;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return (&s[open + 1..i], i + 1);
            }
        }
    }
    panic!("unbalanced brackets");
}

fn ident_before(s: &str) -> String {
    s.trim_end()
        .chars()
        .rev()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// name -> parameter count of every SPECINFER_API function.
fn c_functions(src: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(i) = rest.find("SPECINFER_API") {
        rest = &rest[i + "SPECINFER_API".len()..];
        let open = rest.find('(').unwrap();
        let name = ident_before(&rest[..open]);
        let (params, end) = bracketed(rest, open);
        let n = if params.trim() == "void" { 0 } else { split_top(params, ',').len() };
        assert!(out.insert(name.clone(), n).is_none(), "{name} declared twice in the header");
        rest = &rest[end..];
    }
    out
}

fn rust_functions(src: &str) -> BTreeMap<String, usize> {
    let start = src.find("extern \"C\" {").expect("no extern block");
    let (body, _) = bracketed(src, start + "extern \"C\" ".len());
    let mut out = BTreeMap::new();
    let mut rest = body;
    while let Some(i) = rest.find("pub fn ") {
        rest = &rest[i + 7..];
        let open = rest.find('(').unwrap();
        let name = rest[..open].trim().to_string();
        let (params, end) = bracketed(rest, open);
        assert!(out.insert(name.clone(), split_top(params, ',').len()).is_none(), "{name} twice");
        rest = &rest[end..];
    }
    out
}

/// A field's type as the Rust declaration should spell it: "i32", "*const c_char",
/// "[c_char; 512]", a typedef's own name, or "fn/N" for a function pointer with N parameters.
fn rust_type_of_c(base: &str, declarator: &str) -> String {
    let scalar = |t: &str| -> String {
        match t {
            "int8_t" => "i8",
            "uint8_t" => "u8",
            "int16_t" => "i16",
            "uint16_t" => "u16",
            "int32_t" => "i32",
            "uint32_t" => "u32",
            "int64_t" => "i64",
            "uint64_t" => "u64",
            "size_t" => "usize",
            "float" => "f32",
            "double" => "f64",
            "char" => "c_char",
            "int" => "c_int",
            "void" => "c_void",
            other => other,
        }
        .to_string()
    };
    // Tokens of "const char *const *": const, char, *, const, *.
    let text = format!("{base} {declarator}").replace('*', " * ");
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let stars = tokens.iter().position(|t| *t == "*").unwrap_or(tokens.len());
    let base_tokens: Vec<&str> = tokens[..stars].iter().copied().filter(|t| *t != "const" && *t != "struct").collect();
    assert_eq!(base_tokens.len(), 1, "cannot read the C type '{base} {declarator}'");
    let mut ty = scalar(base_tokens[0]);
    let mut pointee_const = tokens[..stars].contains(&"const");
    let mut i = stars;
    while i < tokens.len() {
        if tokens[i] == "*" {
            ty = format!("*{} {ty}", if pointee_const { "const" } else { "mut" });
            pointee_const = tokens.get(i + 1) == Some(&"const");
        }
        i += 1;
    }
    ty
}

/// The number of parameters of a C parameter list ("void" is none).
fn c_param_count(params: &str) -> usize {
    if params.trim() == "void" {
        0
    } else {
        split_top(params, ',').len()
    }
}

/// Reads one C struct member declaration ("type a", "type a, b", "type a[N]", or the function
/// pointer "ret (*a)(params)") into (name, Rust type) pairs.
fn c_fields_of(decl: &str) -> Vec<(String, String)> {
    let decl = decl.trim();
    let rename = |n: String| if n == "self" { "this".to_string() } else { n };
    if let Some(p) = decl.find("(*") {
        let name: String = decl[p + 2..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let close = p + decl[p..].find(')').unwrap();
        let open = close + decl[close..].find('(').unwrap();
        let (params, _) = bracketed(decl, open);
        return vec![(rename(name), format!("fn/{}", c_param_count(params)))];
    }
    let parts = split_top(decl, ',');
    let first = &parts[0];
    // The base type is the first declarator's text up to its name (and stars).
    let name_end = first.find('[').unwrap_or(first.len());
    let name = ident_before(&first[..name_end]);
    let before_name = first[..name_end].trim_end();
    let type_text = &before_name[..before_name.len() - name.len()];
    let base_end = type_text.find('*').unwrap_or(type_text.len());
    let (base, first_stars) = (type_text[..base_end].trim(), &type_text[base_end..]);
    let mut out = Vec::new();
    for (k, part) in parts.iter().enumerate() {
        let (stars, rest) = if k == 0 {
            (first_stars.to_string(), &part[type_text.len()..])
        } else {
            let s = part.trim();
            let n = s.find(|c: char| c.is_alphabetic() || c == '_').unwrap_or(0);
            (s[..n].to_string(), &s[n..])
        };
        let rest = rest.trim();
        let (field, ty) = match rest.find('[') {
            Some(b) => {
                let len = rest[b + 1..rest.len() - 1].trim();
                (rest[..b].trim().to_string(), format!("[{}; {len}]", rust_type_of_c(base, &stars)))
            }
            None => (rest.to_string(), rust_type_of_c(base, &stars)),
        };
        out.push((rename(field), ty));
    }
    out
}

/// struct name -> (field, Rust type) in order, for every struct with a body in the C headers.
fn c_structs(src: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(i) = rest.find("struct ") {
        rest = &rest[i + 7..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let after = rest[name.len()..].trim_start();
        if !after.starts_with('{') {
            continue;
        }
        let open = rest.len() - after.len();
        let (body, end) = bracketed(rest, open);
        let fields = split_top(body, ';').iter().flat_map(|f| c_fields_of(f)).collect();
        out.insert(name, fields);
        rest = &rest[end..];
    }
    out
}

/// A Rust field type as compared with the C one: whitespace normalized, and a function pointer
/// `Option<unsafe extern "C" fn(...)>` as "fn/N".
fn rust_type(ty: &str) -> String {
    let ty = ty.split_whitespace().collect::<Vec<_>>().join(" ");
    match ty.find("fn(") {
        Some(i) if ty.starts_with("Option<") => {
            let (params, _) = bracketed(&ty, i + 2);
            format!("fn/{}", split_top(params, ',').len())
        }
        _ => ty,
    }
}

/// Rust source without its // comment lines (comments inside a struct body are not fields).
fn without_line_comments(src: &str) -> String {
    src.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

fn rust_structs(src: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let src = without_line_comments(src);
    let mut out = BTreeMap::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("pub struct ") {
        rest = &rest[i + 11..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let open = rest.find('{').unwrap();
        if rest[..open].contains(';') || name.is_empty() || name.starts_with('$') {
            continue;
        }
        let (body, end) = bracketed(rest, open);
        let fields = split_top(body, ',')
            .iter()
            .filter_map(|f| {
                let (n, t) = f.trim().strip_prefix("pub ")?.split_once(':')?;
                Some((n.trim().to_string(), rust_type(t)))
            })
            .collect();
        out.insert(name, fields);
        rest = &rest[end..];
    }
    out
}

/// name -> parameter count of every function pointer typedef in the C headers.
fn c_fn_typedefs(src: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(i) = rest.find("typedef ") {
        rest = &rest[i + 8..];
        let stmt = &rest[..rest.find(';').unwrap()];
        if stmt.contains('{') {
            continue; // a struct or an enum
        }
        if let Some(p) = stmt.find("(*") {
            let name: String = stmt[p + 2..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let close = p + stmt[p..].find(')').unwrap();
            let open = close + stmt[close..].find('(').unwrap();
            let (params, _) = bracketed(stmt, open);
            out.insert(name, c_param_count(params));
        }
    }
    out
}

/// name -> parameter count of every `pub type X = Option<unsafe extern "C" fn(...)>`.
fn rust_fn_typedefs(src: &str) -> BTreeMap<String, usize> {
    let src = without_line_comments(src);
    let mut out = BTreeMap::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("pub type ") {
        rest = &rest[i + 9..];
        let stmt = &rest[..rest.find(';').unwrap()];
        let (name, ty) = stmt.split_once('=').unwrap();
        if let Some(n) = rust_type(ty).strip_prefix("fn/") {
            out.insert(name.trim().to_string(), n.parse().unwrap());
        }
    }
    out
}

#[test]
fn functions_match_header() {
    let c = c_functions(&strip_c(&header("specinfer.h")));
    assert!(c.len() > 40, "parsed only {} functions from the header", c.len());
    let r = rust_functions(RUST_SRC);
    for (name, n) in &c {
        match r.get(name) {
            None => panic!("{name} is in specinfer.h but not declared in specinfer-sys"),
            Some(m) => assert_eq!(m, n, "{name}: {n} parameters in the header, {m} in specinfer-sys"),
        }
    }
    for name in r.keys() {
        assert!(c.contains_key(name), "{name} is declared in specinfer-sys but not in specinfer.h");
    }
}

#[test]
fn structs_match_headers() {
    let mut c = c_structs(&strip_c(&header("specinfer.h")));
    c.extend(c_structs(&strip_c(&header("specinfer_plugin.h"))));
    let r = rust_structs(RUST_SRC);
    assert!(c.len() >= 20, "parsed only {} structs from the headers", c.len());
    for (name, fields) in &c {
        let rf = r.get(name).unwrap_or_else(|| panic!("struct {name} is missing from specinfer-sys"));
        let names = |f: &Vec<(String, String)>| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(rf), names(fields), "fields of struct {name}");
        for ((field, rt), (_, ct)) in rf.iter().zip(fields) {
            assert_eq!(rt, ct, "type of {name}.{field} (\"fn/N\": a function pointer with N parameters)");
        }
    }
}

#[test]
fn function_pointer_typedefs_match_headers() {
    let mut c = c_fn_typedefs(&strip_c(&header("specinfer.h")));
    c.extend(c_fn_typedefs(&strip_c(&header("specinfer_plugin.h"))));
    let r = rust_fn_typedefs(RUST_SRC);
    assert!(c.len() >= 4, "parsed only {} function typedefs from the headers", c.len());
    for (name, n) in &c {
        let m = r.get(name).unwrap_or_else(|| panic!("typedef {name} is missing from specinfer-sys"));
        assert_eq!(m, n, "{name}: {n} parameters in the header, {m} in specinfer-sys");
    }
}

#[test]
fn status_values_match_header() {
    let src = strip_c(&header("specinfer.h"));
    let start = src.find("typedef enum specinfer_status").unwrap();
    let (body, _) = bracketed(&src, start + src[start..].find('{').unwrap());
    let c: Vec<(String, i32)> = split_top(body, ',')
        .iter()
        .map(|e| {
            let (n, v) = e.split_once('=').unwrap();
            (n.trim().to_string(), v.trim().parse().unwrap())
        })
        .collect();
    let r: Vec<(String, i32)> = STATUS_VALUES.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    assert_eq!(c, r);
    for (name, v) in STATUS_VALUES {
        let s = unsafe { std::ffi::CStr::from_ptr(specinfer_status_str(*v)) };
        assert_eq!(s.to_str().unwrap(), *name);
    }
}

#[test]
fn version_and_plugin_abi_match_header() {
    let h = header("specinfer.h");
    let num = |key: &str, src: &str| -> u32 {
        let line = src.lines().find(|l| l.starts_with(&format!("#define {key} "))).unwrap();
        line.split_whitespace().nth(2).unwrap().trim_end_matches('u').parse().unwrap()
    };
    assert_eq!(num("SPECINFER_VERSION_MAJOR", &h), SPECINFER_VERSION_MAJOR);
    assert_eq!(num("SPECINFER_VERSION_MINOR", &h), SPECINFER_VERSION_MINOR);
    assert_eq!(num("SPECINFER_VERSION_PATCH", &h), SPECINFER_VERSION_PATCH);
    assert_eq!(num("SPECINFER_MAX_TOP_LOGPROBS", &h), SPECINFER_MAX_TOP_LOGPROBS as u32);
    let plugin_h = header("specinfer_plugin.h");
    assert_eq!(num("SPECINFER_PLUGIN_ABI_VERSION", &plugin_h), SPECINFER_PLUGIN_ABI_VERSION);
    assert_eq!(num("SPECINFER_ATTN_STRIDES", &plugin_h), SPECINFER_ATTN_STRIDES);
    assert_eq!(num("SPECINFER_HOST_SHORT_TRUNCATE", &plugin_h), SPECINFER_HOST_SHORT_TRUNCATE);
    assert_eq!(num("SPECINFER_ATTN_KEY_TILES", &plugin_h), SPECINFER_ATTN_KEY_TILES);
    assert_eq!(num("SPECINFER_ATTN_RESCORE", &plugin_h), SPECINFER_ATTN_RESCORE);
    assert_eq!(num("SPECINFER_KEY_TILE", &plugin_h), SPECINFER_KEY_TILE as u32);
    assert_eq!(unsafe { specinfer_version_number() }, SPECINFER_VERSION_NUMBER);
}

#[test]
fn struct_sizes_match_library() {
    unsafe {
        let mut p: specinfer_registry_params = std::mem::zeroed();
        specinfer_registry_params_init(&mut p);
        assert_eq!(p.struct_size as usize, size_of::<specinfer_registry_params>());
        let mut i: specinfer_model_info = std::mem::zeroed();
        specinfer_model_info_init(&mut i);
        assert_eq!(i.struct_size as usize, size_of::<specinfer_model_info>());
        let mut s: specinfer_sampling_params = std::mem::zeroed();
        specinfer_sampling_params_init(&mut s);
        assert_eq!(s.struct_size as usize, size_of::<specinfer_sampling_params>());
        let mut sp: specinfer_session_params = std::mem::zeroed();
        specinfer_session_params_init(&mut sp);
        assert_eq!(sp.struct_size as usize, size_of::<specinfer_session_params>());
        assert_eq!(sp.max_draft, 8);
        let mut st: specinfer_session_stats = std::mem::zeroed();
        specinfer_session_stats_init(&mut st);
        assert_eq!(st.struct_size as usize, size_of::<specinfer_session_stats>());
        let mut ri: specinfer_round_info = std::mem::zeroed();
        specinfer_round_info_init(&mut ri);
        assert_eq!(ri.struct_size as usize, size_of::<specinfer_round_info>());
        let mut stp: specinfer_step_params = std::mem::zeroed();
        specinfer_step_params_init(&mut stp);
        assert_eq!(stp.struct_size as usize, size_of::<specinfer_step_params>());
        assert!(stp.prefill_chunk >= 0);
        let mut ep: specinfer_eval_params = std::mem::zeroed();
        specinfer_eval_params_init(&mut ep);
        assert_eq!(ep.struct_size as usize, size_of::<specinfer_eval_params>());
        assert!(ep.tokens.is_null() && ep.n_past == 0 && ep.n_logits == 0);
        let mut tp: specinfer_train_params = std::mem::zeroed();
        specinfer_train_params_init(&mut tp);
        assert_eq!(tp.struct_size as usize, size_of::<specinfer_train_params>());
        assert!(tp.progress.is_none() && tp.corpus.is_null() && tp.n_corpus == 0);
    }
    assert_eq!(size_of::<specinfer_plugin_error>(), 512);
}
