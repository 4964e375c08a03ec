//! TLS material read from files and checked before anything starts: a
//! listener's certificate chain and private key (which must match), and the
//! CA certificates backends are verified against. Parsing and the key check
//! are rustls's; nothing here is cryptography. The errors say what is wrong
//! with one file; the config names the field.

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ParsedCertificate;
use rustls::sign::CertifiedKey;
use rustls::{InconsistentKeys, RootCertStore};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("not valid PEM: {0}")]
    Pem(pem::Error),
    #[error("no PEM certificate (BEGIN CERTIFICATE) in it")]
    NoCertificate,
    #[error(
        "no PEM private key (BEGIN PRIVATE KEY, BEGIN RSA PRIVATE KEY or BEGIN EC PRIVATE KEY) in it"
    )]
    NoKey,
    #[error("certificate {index} is not a usable X.509 certificate: {reason}")]
    Certificate { index: usize, reason: rustls::Error },
    #[error("not a usable private key: {0}")]
    Key(rustls::Error),
    #[error("the key does not match the certificate (another key pair's)")]
    KeyMismatch,
}

/// The certificates of a PEM file, in order, each parsed as X.509.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = std::fs::read(path).map_err(TlsError::Read)?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsError::Pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    for (index, cert) in certs.iter().enumerate() {
        ParsedCertificate::try_from(cert)
            .map_err(|reason| TlsError::Certificate { index, reason })?;
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = std::fs::read(path).map_err(TlsError::Read)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey,
        other => TlsError::Pem(other),
    })
}

/// A chain and its key, ready to serve: the key must be one ring can sign
/// with, and its public half the one in the first certificate.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, TlsError> {
    let provider = rustls::crypto::ring::default_provider();
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(TlsError::Key)?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch)
        }
        Err(other) => Err(TlsError::Key(other)),
    }
}

/// Check that a CA file holds certificates that can all be trust anchors.
pub fn check_ca_file(path: &Path) -> Result<(), TlsError> {
    let mut store = RootCertStore::empty();
    for (index, cert) in read_certificates(path)?.into_iter().enumerate() {
        store
            .add(cert)
            .map_err(|reason| TlsError::Certificate { index, reason })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
