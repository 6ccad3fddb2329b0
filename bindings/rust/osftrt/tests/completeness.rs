//! Every function of the C API (as bindgen declared it from the headers in
//! osftrt-sys) is called by the safe crate, so a header that gains a
//! function fails here until the safe API covers it.
use std::collections::BTreeSet;

/// `*_init` functions of structs whose defaults are all NULL/0: the safe
/// crate fills those structs itself (struct_size plus its fields), once per
/// call, which is exactly what the init function would write.
const BUILT_DIRECTLY: &[&str] = &[
    "osft_flce_inputs_init",
    "osft_flce_outputs_init",
    "osft_flinear_factors_init",
    "osft_flinear_grads_init",
    "osft_mlp_weights_init",
    "osft_mlp_grads_init",
    "osft_projection_target_init",
    // The structs the library fills in (1.3.0): zeros and struct_size.
    "osft_memory_stats_init",
    "osft_flce_plan_init",
    "osft_comm_stats_init",
    "osft_projector_info_init",
    "osft_flinear_info_init",
    "osft_mlp_plan_init",
];

#[test]
fn the_safe_crate_calls_every_c_function() {
    let bindings = include_str!("../../osftrt-sys/src/bindings.rs");
    let declared: BTreeSet<&str> = bindings
        .split("pub fn ")
        .skip(1)
        .filter_map(|rest| rest.split(['(', ' ']).next())
        .filter(|name| name.starts_with("osft_"))
        .collect();
    assert!(
        declared.len() > 80,
        "only {} functions parsed",
        declared.len()
    );
    let src_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut src = String::new();
    for entry in std::fs::read_dir(&src_dir).unwrap() {
        src += &std::fs::read_to_string(entry.unwrap().path()).unwrap();
    }
    let missing: Vec<&str> = declared
        .iter()
        .copied()
        .filter(|f| !BUILT_DIRECTLY.contains(f))
        .filter(|f| !src.contains(&format!("sys::{f}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "C functions without a safe wrapper: {missing:?}"
    );
    for f in BUILT_DIRECTLY {
        assert!(
            declared.contains(f),
            "{f} is no longer in the headers: update BUILT_DIRECTLY"
        );
    }
}

/// Struct fields the safe crate leaves at their `*_init` default, and why.
const FIELDS_LEFT_DEFAULT: &[(&str, &str)] = &[
    (
        "osft_allocator_s.device_alloc",
        "HostAllocator is host-only: device memory comes from the library's own pool",
    ),
    ("osft_allocator_s.device_free", "as device_alloc"),
    (
        "osft_comm_callbacks_s.release",
        "the Comm owns the boxed callbacks and drops them after osft_comm_destroy",
    ),
];

fn safe_crate_source() -> String {
    let src_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut src = String::new();
    for entry in std::fs::read_dir(&src_dir).unwrap() {
        src += &std::fs::read_to_string(entry.unwrap().path()).unwrap();
    }
    src
}

/// Whether the field `name` is read or written in `src`: `x.name`, or
/// `name: value` / `name,` in a struct literal (a declaration `pub name:`
/// of the safe crate's own structs does not count).
fn used_as_field(src: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    src.match_indices(name).any(|(i, _)| {
        let prev = src[..i].chars().next_back();
        let next = src[i + name.len()..].chars().next();
        if prev.map_or(false, word) || next.map_or(false, word) {
            return false;
        }
        let rest = src[i + name.len()..].trim_start();
        let literal = (rest.starts_with(':') && !rest.starts_with("::")) || rest.starts_with(',');
        prev == Some('.') || (literal && !src[..i].ends_with("pub "))
    })
}

/// Every enumerator of the headers (bindgen's typed constants) is named by
/// the safe crate, so a header that gains an enumerator fails here until
/// the safe API can pass or report it.
#[test]
fn the_safe_crate_maps_every_enumerator() {
    let bindings = include_str!("../../osftrt-sys/src/bindings.rs");
    let src = safe_crate_source();
    let mut n = 0;
    let mut missing = Vec::new();
    for line in bindings.lines() {
        // `pub const NAME : osft_xxx_e = VALUE ;` (rust-version 1.63: no let-else)
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() < 5 || parts[0] != "pub" || parts[1] != "const" || parts[3] != ":" {
            continue;
        }
        let (name, ty) = (parts[2], parts[4]);
        if !(name.starts_with("OSFT_") && ty.starts_with("osft_") && ty.ends_with("_e")) {
            continue;
        }
        n += 1;
        if !src.contains(&format!("sys::{name}")) {
            missing.push(name);
        }
    }
    assert!(n > 60, "only {n} enumerators parsed");
    assert!(
        missing.is_empty(),
        "enumerators the safe crate never names: {missing:?}"
    );
}

/// Every field of every public struct is read or written by the safe
/// crate (or listed in FIELDS_LEFT_DEFAULT), so a field appended to a
/// header fails here until the safe API passes or reports it.
#[test]
fn the_safe_crate_uses_every_struct_field() {
    let bindings = include_str!("../../osftrt-sys/src/bindings.rs");
    let src = safe_crate_source();
    let mut n = 0;
    let mut missing = Vec::new();
    let mut seen = Vec::new();
    for chunk in bindings.split("pub struct ").skip(1) {
        let name = chunk.split_whitespace().next().unwrap_or("");
        if !name.starts_with("osft_") {
            continue;
        }
        let body = chunk
            .split('{')
            .nth(1)
            .unwrap_or("")
            .split('}')
            .next()
            .unwrap_or("");
        for decl in body.split("pub ").skip(1) {
            let field = decl.split_whitespace().next().unwrap_or("");
            if field == "struct_size" || field.is_empty() {
                continue;
            }
            n += 1;
            let full = format!("{name}.{field}");
            let skipped = FIELDS_LEFT_DEFAULT.iter().any(|(f, _)| *f == full);
            let used = used_as_field(&src, field);
            assert!(
                !(skipped && used),
                "{full} is used but listed in FIELDS_LEFT_DEFAULT"
            );
            if !skipped && !used {
                missing.push(full.clone());
            }
            seen.push(full);
        }
    }
    assert!(n > 120, "only {n} struct fields parsed");
    assert!(
        missing.is_empty(),
        "struct fields the safe crate never reads or writes: {missing:?}"
    );
    for (f, _) in FIELDS_LEFT_DEFAULT {
        assert!(
            seen.iter().any(|s| s == f),
            "{f} is no longer in the headers"
        );
    }
}
