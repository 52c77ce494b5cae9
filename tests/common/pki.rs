//! A throwaway PKI for TLS tests and benchmarks (also `#[path]`-included by
//! benches/network.rs).

use std::path::Path;
use std::process::Command;

/// A test PKI in `dir`, made with openssl (P-256 keys): a CA (`ca.crt`, `ca.key`), a server's pair
/// for 127.0.0.1 (`server.crt`, `server.key`) and a client's (`client.cert`,
/// `client.key`), each signed by the CA and good for two days.
pub fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("/usr/bin/openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=forkd test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-addext",
        "subjectKeyIdentifier=hash",
    ]);
    // What strict verifiers (Python 3.13's ssl) ask of a leaf: key usage and key ids.
    let leaf = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n";
    let server_ext = format!("{leaf}extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n");
    let client_ext = format!("{leaf}extendedKeyUsage=clientAuth\n");
    for (who, cn, ext, cert) in [
        ("server", "/CN=127.0.0.1", server_ext.as_str(), "server.crt"),
        (
            "client",
            "/CN=forkd-client",
            client_ext.as_str(),
            "client.cert",
        ),
    ] {
        let (key, csr, extfile) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("{who}.ext"),
        );
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            cn,
        ]);
        std::fs::write(dir.join(&extfile), ext).unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ]);
    }
}
