//! TLS to members. An `https://` cluster gets its own rustls client configuration, built when
//! the table is loaded from the cluster's [`Material`]: its CA bundle (else the system's
//! roots), its client certificate and key for mutual TLS, hostname verification always (there
//! is no insecure mode), and only HTTP/1.1 over TLS — an `https://` URL is never tried over
//! plain http. The pooled connector is built once per cluster, on first use, with the
//! gateway's connect timeout. A certificate the CA does not vouch for, a wrong hostname or a
//! client certificate the member refuses is a configuration fault ([`tls_fault`]), reported as
//! the cluster's `UpstreamTls` health reason with rustls' own words, not an outage.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::member::Material;

/// The upstream client of an `https://` cluster.
pub type TlsClient = HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A cluster's TLS settings and, once used, its pooled client.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
    /// Hash of the material it was built from (tables compare clusters by it).
    fingerprint: u64,
    client: Arc<OnceLock<TlsClient>>,
}

impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tls({:016x})", self.fingerprint)
    }
}

impl Tls {
    /// TLS for a cluster from its material: the CA bundle (else the system's roots) and the
    /// client certificate and key, both or neither. `Err` names what is wrong.
    pub fn new(m: &Material) -> Result<Self, String> {
        flotilla_apis::crypto::install_crypto();
        let mut roots = RootCertStore::empty();
        match &m.ca_pem {
            Some(pem) => {
                let certs = CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the CA bundle is not PEM certificates: {e}"))?;
                if certs.is_empty() {
                    return Err("the CA bundle holds no PEM certificate".into());
                }
                for c in certs {
                    roots.add(c).map_err(|e| format!("the CA bundle holds an unusable certificate: {e}"))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    return Err("no CA bundle given and the system has no usable root certificates: give one".into());
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_root_certificates(roots);
        let config = match (&m.client_cert_pem, &m.client_key_pem) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the client certificate is not PEM: {e}"))?;
                if chain.is_empty() {
                    return Err("the client certificate file holds no PEM certificate".into());
                }
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|_| "the client key is not a PEM private key".to_string())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the client certificate and key do not go together: {e}"))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("a client certificate needs its key and a key its certificate: give both".into()),
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&m.ca_pem, &m.client_cert_pem, &m.client_key_pem).hash(&mut h);
        Ok(Tls { config: Arc::new(config), fingerprint: h.finish(), client: Arc::new(OnceLock::new()) })
    }

    /// The cluster's pooled client (built on first use with `connect_timeout`).
    pub fn client(&self, connect_timeout: Duration) -> &TlsClient {
        self.client.get_or_init(|| {
            let mut http = HttpConnector::new();
            http.set_connect_timeout(Some(connect_timeout));
            http.set_nodelay(true);
            http.enforce_http(false);
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config((*self.config).clone())
                .https_only()
                .enable_http1()
                .wrap_connector(http);
            HyperClient::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(https)
        })
    }
}

/// The TLS failure in an error's chain, if any: rustls' description of it (an unknown issuer,
/// a wrong hostname, a refused client certificate), for the `UpstreamTls` reason.
pub fn tls_fault(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        // hyper-rustls wraps tokio-rustls' io::Error in another one, and an io::Error's
        // `source()` skips the error it wraps: descend into the wrapped one instead.
        cur = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}
