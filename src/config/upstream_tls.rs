//! `upstream_tls`: the trust for backends reached over TLS (their entries'
//! `tls` and `sni` are in `address`).

use std::path::Path;

use serde::Deserialize;

use crate::field::{invalid, Invalid};
use crate::tls::material;

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsFile {
    /// PEM CA certificates that backends' certificates must chain to.
    /// Default: the system's trust store.
    ca_file: Option<String>,
}

/// The CA file, checked to hold certificates; none: the system's store.
pub fn validate(u: UpstreamTlsFile) -> Result<Option<String>, Invalid> {
    if let Some(path) = &u.ca_file {
        material::check_ca_file(Path::new(path))
            .map_err(|e| invalid("gateway.upstream_tls.ca_file", path, &e.to_string()))?;
    }
    Ok(u.ca_file)
}
