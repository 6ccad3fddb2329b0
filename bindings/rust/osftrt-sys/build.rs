//! Finds the installed libosftrt through the `pkg-config` command (no build
//! dependencies from crates.io) and links it.
//!
//! `PKG_CONFIG_PATH` must reach `osftrt.pc`, e.g. after
//! `source .ci/lib_prefix.sh` or `export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig`.
//! At run time the dynamic loader must find `libosftrt.so.1` as well
//! (`LD_LIBRARY_PATH`, an rpath, or a system prefix).
use std::process::Command;

fn pkg_config(args: &[&str]) -> Result<String, String> {
    let cmd = std::env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&cmd)
        .args(args)
        .arg("osftrt")
        .output()
        .map_err(|e| format!("cannot run `{cmd}`: {e} (Debian: apt-get install pkg-config)"))?;
    if !out.status.success() {
        return Err(format!(
            "`{cmd} {} osftrt` failed: {}\nSet PKG_CONFIG_PATH to the directory holding \
             osftrt.pc (e.g. `source .ci/lib_prefix.sh` in the libosftrt repository).",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    // Refuse a library older than the headers the bindings were generated
    // from, or of another major version, at build time (the safe crate
    // checks again at run time; ABI.md "Versions"). The version is read
    // from the generated bindings, so it cannot drift from them.
    println!("cargo:rerun-if-changed=src/bindings.rs");
    let bindings = std::fs::read_to_string("src/bindings.rs").expect("read src/bindings.rs");
    let constant = |name: &str| -> u32 {
        let pat = format!("pub const {name} : u32 = ");
        let at = bindings
            .find(&pat)
            .unwrap_or_else(|| panic!("{name} not in src/bindings.rs"));
        let rest = &bindings[at + pat.len()..];
        rest[..rest.find(' ').unwrap_or(rest.len())]
            .parse()
            .expect("a version number")
    };
    let (major, minor) = (
        constant("OSFT_VERSION_MAJOR"),
        constant("OSFT_VERSION_MINOR"),
    );
    let (least, most) = (
        format!("--atleast-version={major}.{minor}"),
        format!("--max-version={major}.999"),
    );
    if let Err(e) = pkg_config(&[&least, &most]) {
        panic!("libosftrt {major}.x (>= {major}.{minor}) not found through pkg-config: {e}");
    }
    let libs = pkg_config(&["--libs"]).unwrap_or_else(|e| panic!("{e}"));
    let mut linked = false;
    for flag in libs.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
            linked |= lib == "osftrt";
        }
    }
    if !linked {
        panic!("pkg-config --libs osftrt did not name -losftrt: {libs}");
    }
    if let Ok(cflags) = pkg_config(&["--cflags-only-I"]) {
        if let Some(dir) = cflags.split_whitespace().find_map(|f| f.strip_prefix("-I")) {
            // DEP_OSFTRT_INCLUDE for crates that compile C against the headers.
            println!("cargo:include={dir}");
        }
    }
    if let Ok(libdir) = pkg_config(&["--variable=libdir"]) {
        // DEP_OSFTRT_LIBDIR, e.g. for an rpath in a dependent binary.
        println!("cargo:libdir={libdir}");
    }
}
