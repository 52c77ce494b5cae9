//! Links `forkd-init` (the program inside every sandbox) as a static executable at a
//! fixed address: see `src/bin/forkd-init.rs` for why. rustc asks for a static PIE
//! (`-static-pie`, from `+crt-static`); `-no-pie -static` after it make the linker
//! produce a plain static executable instead, with no relocations left to apply at
//! start but the ifunc ones. Only that binary: `forkd` itself stays position
//! independent.

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let static_crt = std::env::var("CARGO_CFG_TARGET_FEATURE")
        .map(|f| f.split(',').any(|x| x == "crt-static"))
        .unwrap_or(false);
    if target.contains("linux-gnu") && static_crt {
        println!("cargo::rustc-link-arg-bin=forkd-init=-no-pie");
        println!("cargo::rustc-link-arg-bin=forkd-init=-static");
    }
    println!("cargo::rerun-if-changed=build.rs");
}
