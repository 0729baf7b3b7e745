//! TLS to members, with certificates made here (rcgen) and the engine simulator behind a
//! rustls listener: the right CA serves; a wrong CA, a certificate for another host, or a
//! missing client certificate where the member demands one (mutual TLS) is refused with the
//! cluster's `UpstreamTls` reason and an honest 502 — and nothing reaches the engine, over
//! TLS or, downgraded, over plain http.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use flotilla_enginesim::{SimConfig, SimState};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

/// A certificate authority: its certificate (PEM too) and key.
struct Ca {
    pem: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca { pem: cert.pem(), cert, key }
}

/// A leaf certificate for `names` signed by `ca`, for a server or a client: (cert PEM, key PEM).
fn leaf(ca: &Ca, names: &[&str], client: bool) -> (String, String) {
    let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.extended_key_usages =
        vec![if client { ExtendedKeyUsagePurpose::ClientAuth } else { ExtendedKeyUsagePurpose::ServerAuth }];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The engine simulator serving over TLS on loopback with `cert`; with `client_ca`, only to
/// clients presenting a certificate it signed. Returns its port and state.
async fn tls_engine(cert: &(String, String), client_ca: Option<&Ca>) -> (u16, Arc<SimState>) {
    flotilla_apis::crypto::install_crypto();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.0.as_bytes()).collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_slice(cert.1.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = Arc::new(builder.with_single_cert(chain, key).unwrap());
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = SimState::new(SimConfig { models: vec!["m".into()], ttft_ms: 1, itl_ms: 1, ..SimConfig::default() });
    let router = flotilla_enginesim::api::router(state.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    router.clone().oneshot(req.map(axum::body::Body::new))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    (port, state)
}

/// Write `text` to a fresh file; its path.
fn file(stem: &str, text: &str) -> String {
    let p = temp_path(stem);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn cluster(name: &str, url: &str, extra: &str) -> String {
    format!("  - {{name: {name}, url: \"{url}\", jurisdiction: EU{extra}}}\n")
}

#[tokio::test]
async fn the_right_ca_serves_and_a_wrong_ca_or_host_is_refused_with_a_reason() {
    let (good_ca, other_ca) = (ca("fleet CA"), ca("someone else's CA"));
    let (port, engine) = tls_engine(&leaf(&good_ca, &["localhost"], false), None).await;
    let (wrong_host_port, wrong_host) = tls_engine(&leaf(&good_ca, &["other.example"], false), None).await;
    let (good, other) = (file("ca-good", &good_ca.pem), file("ca-other", &other_ca.pem));
    let yaml = format!(
        "clusters:\n{}{}{}models:\n  - {{name: m, routes: [{{cluster: good}}]}}\n  - {{name: m-bad-ca, routes: [{{cluster: bad-ca}}]}}\n  - {{name: m-bad-host, routes: [{{cluster: bad-host}}]}}\n",
        cluster("good", &format!("https://localhost:{port}"), &format!(", caFile: \"{good}\"")),
        cluster("bad-ca", &format!("https://localhost:{port}"), &format!(", caFile: \"{other}\"")),
        cluster("bad-host", &format!("https://localhost:{wrong_host_port}"), &format!(", caFile: \"{good}\"")),
    );
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "good"), "{}", r.text);
    let s = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "hi", false)).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "streams over TLS too");
    assert_eq!(engine.request_count(), 2);

    for (model, cluster, words) in
        [("m-bad-ca", "bad-ca", "UnknownIssuer"), ("m-bad-host", "bad-host", "not valid for name \"localhost\"")]
    {
        let r = post(&gw.url("/v1/chat/completions"), &chat(model, "hi")).await;
        assert_eq!(r.status, 502, "{}", r.text);
        assert_eq!(r.json()["error"]["code"], "upstream_misconfigured");
        assert!(
            r.json()["error"]["message"].as_str().unwrap().contains(&format!("{cluster}: UpstreamTls")),
            "{}",
            r.text
        );
        assert!(r.headers.get("retry-after").is_none());
        let (reason, message) = gw.state.health.get(cluster).fault().expect("a health reason");
        assert_eq!(format!("{reason:?}"), "UpstreamTls");
        assert!(message.contains(words) && message.contains("CA bundle"), "{message}");
        let m = get(&gw.url("/metrics")).await.text;
        let line = format!("flotilla_gateway_upstream_attempts_total{{cluster=\"{cluster}\",result=\"tls_error\"}} 1");
        assert!(m.lines().any(|l| l == line), "{m}");
        let gauge = format!("flotilla_gateway_cluster_misconfigured{{cluster=\"{cluster}\",reason=\"UpstreamTls\"}} 1");
        assert!(m.lines().any(|l| l == gauge), "{m}");
    }
    assert_eq!(engine.request_count(), 2, "the wrongly verified cluster's requests never reached the engine");
    assert_eq!(wrong_host.request_count(), 0, "nor the engine with a certificate for another host");
    let ready = get(&gw.url("/readyz")).await.text;
    assert!(ready.contains("cluster bad-ca MISCONFIGURED (UpstreamTls)"), "{ready}");
}

#[tokio::test]
async fn mutual_tls_presents_the_client_certificate_and_a_missing_one_is_a_reason() {
    let fleet = ca("fleet CA");
    let (port, engine) = tls_engine(&leaf(&fleet, &["localhost"], false), Some(&fleet)).await;
    let (cert, key) = leaf(&fleet, &["flotilla-gateway"], true);
    let (ca_file, cert_file, key_file) = (file("mtls-ca", &fleet.pem), file("mtls-crt", &cert), file("mtls-key", &key));
    let url = format!("https://localhost:{port}");
    let yaml = format!(
        "clusters:\n{}{}models:\n  - {{name: m, routes: [{{cluster: with-cert}}]}}\n  - {{name: m-anon, routes: [{{cluster: no-cert}}]}}\n",
        cluster(
            "with-cert",
            &url,
            &format!(", caFile: \"{ca_file}\", clientCertFile: \"{cert_file}\", clientKeyFile: \"{key_file}\"")
        ),
        cluster("no-cert", &url, &format!(", caFile: \"{ca_file}\"")),
    );
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "with-cert"), "{}", r.text);
    let r = post(&gw.url("/v1/chat/completions"), &chat("m-anon", "hi")).await;
    assert_eq!(r.status, 502, "{}", r.text);
    let (reason, message) = gw.state.health.get("no-cert").fault().expect("a health reason");
    assert_eq!(format!("{reason:?}"), "UpstreamTls");
    assert!(message.contains("CertificateRequired"), "{message}");
    assert_eq!(engine.request_count(), 1, "only the request with the client certificate reached the engine");
}

#[tokio::test]
async fn tls_settings_on_a_plain_http_url_are_refused_at_load() {
    let fleet = ca("fleet CA");
    let ca_file = file("http-ca", &fleet.pem);
    let yaml =
        format!("clusters:\n{}models: []\n", cluster("a", "http://localhost:1", &format!(", caFile: \"{ca_file}\"")));
    let e = flotilla_gateway::RoutingTable::from_yaml("t", &yaml).unwrap_err().to_string();
    assert!(e.contains("cluster `a`") && e.contains("use https://"), "{e}");
    let garbage = file("bad-ca", "not a certificate");
    let yaml =
        format!("clusters:\n{}models: []\n", cluster("a", "https://localhost:1", &format!(", caFile: \"{garbage}\"")));
    let e = flotilla_gateway::RoutingTable::from_yaml("t", &yaml).unwrap_err().to_string();
    assert!(e.contains("CA bundle"), "{e}");
    let (cert, _) = leaf(&fleet, &["gw"], true);
    let cert_file = file("half-mtls", &cert);
    let yaml = format!(
        "clusters:\n{}models: []\n",
        cluster("a", "https://localhost:1", &format!(", caFile: \"{ca_file}\", clientCertFile: \"{cert_file}\""))
    );
    let e = flotilla_gateway::RoutingTable::from_yaml("t", &yaml).unwrap_err().to_string();
    assert!(e.contains("give both"), "{e}");
}
