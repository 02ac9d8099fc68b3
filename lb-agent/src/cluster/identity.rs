//! The cluster's identity, derived from the shared key file: one Ed25519 key pair and
//! one self-signed certificate, the same bytes on every member, and the QUIC client and
//! server configurations that present it and accept nothing else (mutual TLS with the
//! certificate and key pinned; docs/internals/cluster-sync.md).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ring::signature::{self, KeyPair as _};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::error::KeyError;

/// Smallest key file.
pub const MIN_KEY_LEN: usize = 32;
/// The ALPN protocol of the sync connections.
pub const ALPN: &[u8] = b"lb-sync/1";
/// The name both sides put in, and expect from, the certificate.
pub const SERVER_NAME: &str = "lb-cluster";
/// A connection without any packet for this long is dead (keep-alives every second).
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// PKCS#8 v1 prefix of an Ed25519 private key (RFC 8410), followed by the 32-byte seed.
const PKCS8_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The key pair and certificate every member derives from the same key file.
#[derive(Clone)]
pub struct Identity {
    pkcs8: Vec<u8>,
    public_key: Vec<u8>,
    cert: CertificateDer<'static>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

/// Reads the key file, refusing one that is short or that others may read.
pub fn read_key(path: &Path) -> Result<Vec<u8>, KeyError> {
    let read = |source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Readable {
            path: path.to_path_buf(),
            mode,
        });
    }
    let key = std::fs::read(path).map_err(read)?;
    if key.len() < MIN_KEY_LEN {
        return Err(KeyError::Short {
            path: path.to_path_buf(),
            len: key.len(),
            min: MIN_KEY_LEN,
        });
    }
    Ok(key)
}

impl Identity {
    /// The identity `secret` gives: HKDF-SHA256 (salt `lb-cluster-sync`, info
    /// `ed25519 identity`) makes the Ed25519 seed; the certificate has a fixed subject,
    /// serial and validity, and Ed25519 signs deterministically.
    pub fn derive(secret: &[u8]) -> Result<Identity, KeyError> {
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"lb-cluster-sync");
        let mut seed = [0u8; 32];
        salt.extract(secret)
            .expand(&[b"ed25519 identity"], SeedLen)
            .and_then(|okm| okm.fill(&mut seed))
            .map_err(|_| KeyError::Certificate("HKDF failed".into()))?;
        let pair = signature::Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|e| KeyError::Certificate(e.to_string()))?;
        let mut pkcs8 = PKCS8_ED25519_PREFIX.to_vec();
        pkcs8.extend_from_slice(&seed);
        let cert_err = |e: rcgen::Error| KeyError::Certificate(e.to_string());
        let key = rcgen::KeyPair::try_from(pkcs8.as_slice()).map_err(cert_err)?;
        let mut params =
            rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(cert_err)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, SERVER_NAME);
        params.serial_number = Some(rcgen::SerialNumber::from(vec![1]));
        params.not_before = rcgen::date_time_ymd(1975, 1, 1);
        params.not_after = rcgen::date_time_ymd(4096, 1, 1);
        let cert = params.self_signed(&key).map_err(cert_err)?;
        Ok(Identity {
            public_key: pair.public_key().as_ref().to_vec(),
            pkcs8,
            cert: cert.der().clone(),
        })
    }

    fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.pkcs8.clone()))
    }

    fn pinned(&self) -> Arc<Pinned> {
        Arc::new(Pinned {
            cert: self.cert.clone(),
            public_key: self.public_key.clone(),
        })
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// What the acceptor of sync connections uses.
    pub fn server_config(&self) -> quinn::ServerConfig {
        let mut tls = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .with_client_cert_verifier(self.pinned())
            .with_single_cert(vec![self.cert.clone()], self.key_der())
            .expect("the derived key matches its certificate");
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .expect("TLS 1.3 with an initial cipher suite");
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(transport());
        config
    }

    /// What the dialer of sync connections uses.
    pub fn client_config(&self) -> quinn::ClientConfig {
        let mut tls = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(self.pinned())
            .with_client_auth_cert(vec![self.cert.clone()], self.key_der())
            .expect("the derived key matches its certificate");
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
            .expect("TLS 1.3 with an initial cipher suite");
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(transport());
        config
    }
}

struct SeedLen;

impl ring::hkdf::KeyType for SeedLen {
    fn len(&self) -> usize {
        32
    }
}

fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    t.max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("a few seconds fit")));
    t.max_concurrent_uni_streams(0u8.into());
    t.max_concurrent_bidi_streams(1u8.into());
    Arc::new(t)
}

/// Accepts exactly the cluster's certificate, and handshake signatures by its key.
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    public_key: Vec<u8>,
}

impl Pinned {
    fn check_cert(&self, presented: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        if presented.as_ref() == self.cert.as_ref() {
            Ok(())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn check_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check_cert(cert)?;
        if dss.scheme != SignatureScheme::ED25519 {
            return Err(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ));
        }
        signature::UnparsedPublicKey::new(&signature::ED25519, &self.public_key)
            .verify(message, dss.signature())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadSignature))?;
        Ok(HandshakeSignatureValid::assertion())
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check_cert(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

impl ClientCertVerifier for Pinned {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check_cert(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_secret_gives_the_same_identity_and_another_a_different_one() {
        let a = Identity::derive(&[1; 32]).unwrap();
        let b = Identity::derive(&[1; 32]).unwrap();
        let c = Identity::derive(&[2; 32]).unwrap();
        assert_eq!(a.cert, b.cert);
        assert_eq!(a.public_key, b.public_key);
        assert_ne!(a.cert, c.cert);
        assert_ne!(a.public_key, c.public_key);
        assert!(a.pinned().check_cert(&c.cert).is_err());
    }

    #[test]
    fn the_key_file_must_be_long_and_private() {
        let dir = std::env::temp_dir().join(format!("lb-cluster-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, [9u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_key(&path).unwrap(), [9u8; 32]);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read_key(&path),
            Err(KeyError::Readable { mode: 0o640, .. })
        ));
        std::fs::write(&path, [9u8; 31]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(matches!(
            read_key(&path),
            Err(KeyError::Short { len: 31, .. })
        ));
        assert!(matches!(
            read_key(&dir.join("none")),
            Err(KeyError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
