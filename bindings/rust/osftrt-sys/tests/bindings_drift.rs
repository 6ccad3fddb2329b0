//! The committed src/bindings.rs must be exactly what generate.sh makes from
//! the current headers: this test regenerates it and fails on any
//! difference. It needs the `bindgen` command (Debian package `bindgen`);
//! set OSFTRT_SKIP_BINDGEN_CHECK=1 to skip it on purpose (it then prints
//! that it was skipped) where bindgen cannot be installed.
use std::path::PathBuf;
use std::process::Command;

#[test]
fn bindings_match_headers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("OSFTRT_SKIP_BINDGEN_CHECK").is_some() {
        eprintln!("bindings_match_headers: SKIPPED (OSFTRT_SKIP_BINDGEN_CHECK is set)");
        return;
    }
    let out = std::env::temp_dir().join(format!("osftrt-bindings-{}.rs", std::process::id()));
    let status = Command::new("bash")
        .arg(dir.join("generate.sh"))
        .arg(&out)
        .status()
        .expect("cannot run bash generate.sh");
    assert!(
        status.success(),
        "generate.sh failed ({status}); install bindgen (apt-get install bindgen) \
         or set OSFTRT_SKIP_BINDGEN_CHECK=1"
    );
    let fresh = std::fs::read_to_string(&out).expect("read regenerated bindings");
    let _ = std::fs::remove_file(&out);
    let committed =
        std::fs::read_to_string(dir.join("src/bindings.rs")).expect("read src/bindings.rs");
    if fresh != committed {
        let (a, b): (Vec<_>, Vec<_>) = (committed.lines().collect(), fresh.lines().collect());
        let first = a
            .iter()
            .zip(b.iter())
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        panic!(
            "src/bindings.rs is out of date with include/osftrt/*.h (first difference at line \
             {}):\n  committed: {:?}\n  generated: {:?}\nRun bindings/rust/osftrt-sys/generate.sh \
             and commit the result.",
            first + 1,
            a.get(first),
            b.get(first)
        );
    }
}

/// Every function the library exports (`nm -D`) is declared in the bindings.
#[test]
fn every_exported_symbol_is_bound() {
    let libdir = Command::new("pkg-config")
        .args(["--variable=libdir", "osftrt"])
        .output()
        .expect("pkg-config not runnable");
    let libdir = String::from_utf8_lossy(&libdir.stdout).trim().to_string();
    let lib = PathBuf::from(&libdir).join("libosftrt.so");
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm on {}: {e}", lib.display()));
    assert!(nm.status.success(), "nm -D {} failed", lib.display());
    let bindings = include_str!("../src/bindings.rs");
    let mut missing = Vec::new();
    let mut n = 0;
    for line in String::from_utf8_lossy(&nm.stdout).lines() {
        let mut f = line.split_whitespace();
        let (_, kind, name) = (f.next(), f.next(), f.next());
        if kind != Some("T") {
            continue;
        }
        let name = name.unwrap_or("").split('@').next().unwrap_or("");
        if !name.starts_with("osft_") {
            continue;
        }
        n += 1;
        let declared = bindings.contains(&format!("pub fn {name} ("))
            || bindings.contains(&format!("pub fn {name}("));
        if !declared {
            missing.push(name.to_string());
        }
    }
    assert!(
        n > 50,
        "only {n} osft_ functions exported by {}",
        lib.display()
    );
    assert!(missing.is_empty(), "exported but not bound: {missing:?}");
}
