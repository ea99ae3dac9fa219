//! TLS to PostgreSQL with libpq's `sslmode` and `sslrootcert`, read from
//! `database.url`: the one place that decides how a connection is secured.
//! Every connection the service and its CLI open (the pool, migrations, the
//! answer cache's listener) gets its connector from [`target`].
//!
//! The URL's `sslmode` and `sslrootcert` are read by [`crate::pgurl`]; what
//! they mean is done by the certificate verifier below.
//!
//! | `sslmode` | encrypted | chain checked | host name checked |
//! | --- | --- | --- | --- |
//! | `disable` | never | | |
//! | `allow`, `prefer` (the default) | when the server offers it | with `sslrootcert` | |
//! | `require` | always | with `sslrootcert` | |
//! | `verify-ca` | always | yes (`sslrootcert` required) | |
//! | `verify-full` | always | yes | yes |
//!
//! The roots are `sslrootcert`'s certificates (PEM). Where libpq would read
//! `~/.postgresql/root.crt`, `verify-full` without `sslrootcert` uses the
//! system's roots instead: a container has no home directory worth the
//! name, and a managed PostgreSQL's certificate chains to a public root or
//! to one the operator names. `verify-ca` never does: with the name
//! unchecked, every certificate a public CA ever issued would pass.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::pgurl::{PgUrl, SslMode, UrlError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// What is wrong with `database.url`'s TLS parameters; each stops the start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("sslrootcert={}: {source}", path.display())]
    RootCert {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("sslrootcert={}: no usable CA certificate in it", path.display())]
    NoRoots { path: PathBuf },
    #[error("sslmode=verify-full: no system CA certificates found; name them with sslrootcert")]
    NoSystemRoots,
    #[error("building the certificate verifier")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
    #[error("building the TLS configuration")]
    Rustls(#[from] rustls::Error),
}

/// The connection settings of `url` and the connector that secures them as
/// its `sslmode` says.
pub fn target(url: &str) -> Result<(tokio_postgres::Config, PgTls), TlsError> {
    let PgUrl {
        config,
        mode,
        root_cert,
    } = PgUrl::parse(url)?;
    let tls = PgTls::new(mode, root_cert.as_deref())?;
    Ok((config, tls))
}

/// The connector for every connection to the database: cheap to clone, one
/// TLS configuration shared by all.
#[derive(Clone)]
pub struct PgTls(Arc<ClientConfig>);

impl PgTls {
    fn new(mode: SslMode, root_cert: Option<&Path>) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        // libpq checks the chain in `prefer` and `require` too once it has
        // roots: naming a CA is asking for it to be checked.
        let chain = match (mode, root_cert) {
            (SslMode::Disable, _) | (SslMode::Allow | SslMode::Prefer | SslMode::Require, None) => {
                None
            }
            (_, Some(path)) => Some(roots_from(path)?),
            (SslMode::VerifyFull, None) => Some(system_roots()?),
            (SslMode::VerifyCa, None) => return Err(UrlError::VerifyCaWithoutRoot.into()),
        }
        .map(|roots| WebPkiServerVerifier::builder_with_provider(roots, provider.clone()).build())
        .transpose()?;
        let verifier = Verifier {
            chain,
            check_name: mode == SslMode::VerifyFull,
            algorithms,
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        Ok(Self(Arc::new(config)))
    }
}

fn roots_from(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|source| TlsError::RootCert {
            path: path.to_owned(),
            source,
        })?;
    roots.add_parsable_certificates(certs);
    if roots.is_empty() {
        return Err(TlsError::NoRoots {
            path: path.to_owned(),
        });
    }
    Ok(Arc::new(roots))
}

fn system_roots() -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if roots.is_empty() {
        return Err(TlsError::NoSystemRoots);
    }
    Ok(Arc::new(roots))
}

/// `sslmode`'s checks of the server's certificate. The handshake's
/// signatures are checked whenever the chain is: without a checked chain a
/// relay can present a key of its own anyway, so a signature proves
/// nothing, and libpq's `prefer` and `require` must take any certificate,
/// even one that the web PKI cannot parse (the bare X.509 v1 certificate
/// that Citus makes for its nodes).
#[derive(Debug)]
struct Verifier {
    /// `None`: any certificate (libpq's `require` without a root).
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl Verifier {
    /// A handshake signature, checked only with the chain (see above).
    fn signature(
        &self,
        verify: impl FnOnce() -> Result<HandshakeSignatureValid, rustls::Error>,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match self.chain {
            Some(_) => verify(),
            None => Ok(HandshakeSignatureValid::assertion()),
        }
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The web PKI verifier checks the name only after the chain, so a
        // wrong name here means the chain is good: what verify-ca asks.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            verdict => verdict,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature(|| verify_tls12_signature(message, cert, dss, &self.algorithms))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature(|| verify_tls13_signature(message, cert, dss, &self.algorithms))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// True when `error` is a server certificate that `sslmode` refused: not a
/// database that is down, so waiting for it helps nothing.
pub fn is_refused_certificate(error: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let rustls = cause
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if matches!(
            rustls,
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
        ) {
            return true;
        }
        source = cause.source();
    }
    false
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<PgTlsConnect> {
        Ok(PgTlsConnect {
            config: self.0.clone(),
            // A unix socket has no name; it is only an error should TLS be
            // asked for over one.
            server_name: ServerName::try_from(host.to_owned()).ok(),
        })
    }
}

pub struct PgTlsConnect {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = self.server_name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "TLS needs a host name or address in database.url",
                )
            })?;
            let stream = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(PgTlsStream(stream))
        })
    }
}

pub struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    /// None: SCRAM's channel binding needs the certificate's signature
    /// hash, which would take an X.509 parser; it only adds to `require`
    /// without a root, and `verify-full` is the answer to an active
    /// attacker.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
