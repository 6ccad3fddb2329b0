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
