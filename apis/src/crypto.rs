//! The process's rustls crypto provider, chosen in one place: every binary and test that builds
//! a TLS client (kube's, the gateway's member and Redis connections, fleetctl's) calls
//! [`install_crypto`] first, and the process then uses *ring*. Behind the `crypto` feature, so
//! the API types alone pull in no TLS stack.

/// Makes `ring` the process's rustls crypto provider. kube's TLS asks rustls for the process
/// default, and a workspace build that also links the AWS SDK enables both of rustls' providers,
/// so none is chosen automatically. Idempotent (a provider already installed stays); call before
/// building any client.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_ring_once_and_again_is_harmless() {
        install_crypto();
        install_crypto();
        let installed = rustls::crypto::CryptoProvider::get_default().map(|p| p.cipher_suites.clone());
        assert_eq!(installed, Some(rustls::crypto::ring::default_provider().cipher_suites));
    }
}
