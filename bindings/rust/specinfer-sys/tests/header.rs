//! Checks the hand-written declarations of src/lib.rs against the installed C headers:
//! every SPECINFER_API function is declared with the same number of parameters (and nothing
//! extra), every struct has the same fields in the same order, the status values agree, and the
//! struct sizes agree with what the library's *_init functions write into `struct_size`.

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

/// struct name -> field names in order, for every struct with a body in the C headers.
fn c_structs(src: &str) -> BTreeMap<String, Vec<String>> {
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
        let fields = split_top(body, ';')
            .iter()
            .map(|f| {
                // A function pointer "ret (*name)(...)", an array "type name[N]", or "type name".
                let f = f.trim();
                let field = if let Some(p) = f.find("(*") {
                    f[p + 2..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
                } else if let Some(b) = f.find('[') {
                    ident_before(&f[..b])
                } else {
                    ident_before(f)
                };
                if field == "self" {
                    "this".to_string()
                } else {
                    field
                }
            })
            .collect();
        out.insert(name, fields);
        rest = &rest[end..];
    }
    out
}

fn rust_structs(src: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut rest = src;
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
            .filter_map(|f| f.trim().strip_prefix("pub ").map(|f| f.split(':').next().unwrap().trim().to_string()))
            .collect();
        out.insert(name, fields);
        rest = &rest[end..];
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
        assert_eq!(rf, fields, "fields of struct {name}");
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
    assert_eq!(num("SPECINFER_PLUGIN_ABI_VERSION", &header("specinfer_plugin.h")), SPECINFER_PLUGIN_ABI_VERSION);
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
    }
    assert_eq!(size_of::<specinfer_plugin_error>(), 512);
}
