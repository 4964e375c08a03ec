use std::path::PathBuf;

use super::*;

/// A file with `text` in a fresh temporary directory.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("poimen-tls-unit-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn self_signed(name: &str) -> rcgen::CertifiedKey<rcgen::KeyPair> {
    rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap()
}

#[test]
fn a_matching_pair_loads() {
    let pair = self_signed("a.test");
    let chain = read_certificates(&file("ok-cert.pem", &pair.cert.pem())).unwrap();
    let key = read_key(&file("ok-key.pem", &pair.signing_key.serialize_pem())).unwrap();
    let certified = certified_key(chain, key).unwrap();
    assert_eq!(certified.cert[0], *pair.cert.der());
}

#[test]
fn a_key_of_another_pair_is_refused() {
    let (a, b) = (self_signed("a.test"), self_signed("b.test"));
    let chain = read_certificates(&file("mm-cert.pem", &a.cert.pem())).unwrap();
    let key = read_key(&file("mm-key.pem", &b.signing_key.serialize_pem())).unwrap();
    let err = certified_key(chain, key).unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch), "{err}");
}

#[test]
fn bad_files_say_what_is_wrong() {
    let pair = self_signed("a.test");
    let missing = std::env::temp_dir().join("poimen-tls-unit-no-such-file.pem");
    let cases: [(Result<(), TlsError>, &str); 6] = [
        (read_certificates(&missing).map(drop), "cannot read"),
        (
            read_certificates(&file("garbage.pem", "hello\n")).map(drop),
            "no PEM certificate",
        ),
        (
            read_certificates(&file(
                "bad-b64.pem",
                "-----BEGIN CERTIFICATE-----\n%%%\n-----END CERTIFICATE-----\n",
            ))
            .map(drop),
            "not valid PEM",
        ),
        (
            // Well-formed PEM whose content is no certificate.
            read_certificates(&file(
                "not-x509.pem",
                "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
            ))
            .map(drop),
            "certificate 0 is not a usable X.509 certificate",
        ),
        (
            // A certificate where the key should be.
            read_key(&file("cert-as-key.pem", &pair.cert.pem())).map(drop),
            "no PEM private key",
        ),
        (
            check_ca_file(&file("ca-garbage.pem", "-----BEGIN")),
            "no PEM certificate",
        ),
    ];
    for (result, want) in cases {
        let err = result.unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} does not contain {want:?}");
    }
}

#[test]
fn a_ca_file_loads() {
    let ca = self_signed("ca.test");
    check_ca_file(&file("ca.pem", &ca.cert.pem())).unwrap();
}
