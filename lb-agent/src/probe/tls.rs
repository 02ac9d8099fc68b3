//! TLS for https probes: rustls with the ring provider; the system's roots when `verify`,
//! any certificate otherwise.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, ring};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::ProbeError;

/// The name sent as SNI and checked against the certificate: `sni`, else the `Host`
/// name without its port, else the target's address.
pub(super) fn server_name(
    sni: Option<&str>,
    host: Option<&str>,
    addr: SocketAddr,
) -> Result<ServerName<'static>, ProbeError> {
    let name = match (sni, host) {
        (Some(sni), _) => sni.to_owned(),
        (None, Some(host)) => strip_port(host).to_owned(),
        (None, None) => return Ok(ServerName::IpAddress(addr.ip().into())),
    };
    ServerName::try_from(name.clone()).map_err(|e| ProbeError::Request {
        reason: format!("tls server name {name:?}: {e}"),
    })
}

/// `host[:port]` or `[v6]:port` -> the host part.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// The TLS handshake over `tcp`.
pub(super) async fn connect(
    tcp: TcpStream,
    name: ServerName<'static>,
    verify: bool,
) -> Result<TlsStream<TcpStream>, ProbeError> {
    let config = if verify {
        verifying_config()
    } else {
        any_cert_config()
    };
    handshake(config, tcp, name).await
}

async fn handshake(
    config: Arc<ClientConfig>,
    tcp: TcpStream,
    name: ServerName<'static>,
) -> Result<TlsStream<TcpStream>, ProbeError> {
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|source| ProbeError::Tls { source })
}

fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(ring::default_provider())).clone()
}

/// A client config trusting `roots`, speaking http/1.1.
fn config_with_roots(roots: RootCertStore) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Verifies against the system's trust store, loaded once. An unreadable store leaves it
/// empty: every verifying probe then fails with "UnknownIssuer", which says enough.
fn verifying_config() -> Arc<ClientConfig> {
    static C: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    C.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!("probe tls: loading system certificates: {e}");
        }
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        tracing::debug!("probe tls: {added} system roots ({ignored} unparsable)");
        config_with_roots(roots)
    })
    .clone()
}

/// `verify = false`: any certificate, but the handshake signatures are still checked
/// (the peer holds the key of the certificate it sent).
fn any_cert_config() -> Arc<ClientConfig> {
    static C: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    C.get_or_init(|| {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(
                provider().signature_verification_algorithms,
            )))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    })
    .clone()
}

#[derive(Debug)]
struct AnyCert(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        tokio_rustls::rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        tokio_rustls::rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;
    use tokio_rustls::rustls::ServerConfig;
    use tokio_rustls::rustls::pki_types::PrivateKeyDer;

    #[test]
    fn strip_port_keeps_the_host() {
        assert_eq!(strip_port("app.example:8443"), "app.example");
        assert_eq!(strip_port("app.example"), "app.example");
        assert_eq!(strip_port("[::1]:443"), "::1");
        assert_eq!(strip_port("::1"), "::1");
    }

    #[test]
    fn server_name_prefers_sni_then_host_then_address() {
        let addr: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let n = server_name(Some("sni.example"), Some("host.example"), addr).unwrap();
        assert_eq!(n.to_str(), "sni.example");
        let n = server_name(None, Some("host.example:8443"), addr).unwrap();
        assert_eq!(n.to_str(), "host.example");
        let n = server_name(None, None, addr).unwrap();
        assert_eq!(n.to_str(), "10.0.0.1");
    }

    /// A verifying handshake succeeds against a CA the client trusts (the system store
    /// cannot be changed by a test, so the roots are given here).
    #[tokio::test]
    async fn verifying_config_accepts_a_trusted_chain() {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["backend.test".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();

        let server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            tls.write_all(b"hi").await.unwrap();
            tls.shutdown().await.unwrap();
        });

        let mut roots = RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("backend.test").unwrap();
        let mut tls = handshake(config_with_roots(roots), tcp, name)
            .await
            .expect("trusted chain verifies");
        let mut got = Vec::new();
        tls.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hi");
        srv.await.unwrap();
    }
}
