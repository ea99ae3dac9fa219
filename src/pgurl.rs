//! `database.url` as libpq reads it: the connection settings, libpq's
//! `sslmode` and `sslrootcert`, and whether it reaches past this machine.
//! Read by the configuration's checks (which name the key) and by the
//! connector that secures every connection (`db::tls`), so that both mean
//! the same URL.
//!
//! tokio-postgres itself knows `sslmode` only as `disable`, `prefer` and
//! `require`, and no `sslrootcert`: both are taken out of a URL here.

use std::net::IpAddr;
use std::path::PathBuf;

use percent_encoding::percent_decode_str;
use tokio_postgres::config::{Host, SslMode as WireMode};

/// What makes `database.url` unusable; the message never holds the URL
/// (it may carry a password).
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("is not a connection string libpq would take")]
    Parse(#[source] tokio_postgres::Error),
    #[error("sslmode={0:?} is not one of disable, allow, prefer, require, verify-ca, verify-full")]
    Mode(String),
    #[error(
        "sslmode=verify-ca without sslrootcert: any certificate a public CA issued, for any \
         name, would pass, so a machine in the path could relay the connection; name the \
         database's CA with sslrootcert, or use sslmode=verify-full"
    )]
    VerifyCaWithoutRoot,
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// libpq tries without TLS first; taken as `prefer` (TLS when the
    /// server offers it), which is never less safe.
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(raw: &str) -> Result<Self, UrlError> {
        Ok(match raw {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(UrlError::Mode(other.to_owned())),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// Whether a machine in the path can turn the connection into plain
    /// text (by refusing TLS, which these modes then go without).
    pub fn can_be_plaintext(self) -> bool {
        matches!(self, Self::Disable | Self::Allow | Self::Prefer)
    }
}

/// A parsed `database.url`.
#[derive(Debug)]
pub struct PgUrl {
    /// The connection settings, `sslmode` set as tokio-postgres knows it.
    pub config: tokio_postgres::Config,
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file of the CA certificates to trust.
    pub root_cert: Option<PathBuf>,
}

impl PgUrl {
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let (rest, mode, root_cert) = take_tls_params(url);
        let mut config: tokio_postgres::Config = rest.parse().map_err(UrlError::Parse)?;
        // A key=value string keeps its `sslmode` (tokio-postgres reads the
        // three it knows); a URL's was taken out above.
        let mode = match mode {
            Some(raw) => SslMode::parse(&raw)?,
            None => match config.get_ssl_mode() {
                WireMode::Disable => SslMode::Disable,
                WireMode::Require => SslMode::Require,
                _ => SslMode::Prefer,
            },
        };
        if mode == SslMode::VerifyCa && root_cert.is_none() {
            return Err(UrlError::VerifyCaWithoutRoot);
        }
        config.ssl_mode(match mode {
            SslMode::Disable => WireMode::Disable,
            SslMode::Allow | SslMode::Prefer => WireMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
        });
        Ok(Self {
            config,
            mode,
            root_cert: root_cert.map(PathBuf::from),
        })
    }

    /// Whether every host is this machine: a Unix socket, or a loopback
    /// name or address, where no one stands in the path.
    pub fn is_local(&self) -> bool {
        let hosts = self.config.get_hosts();
        // No host: libpq's default, the Unix socket.
        hosts.iter().all(|host| match host {
            Host::Unix(_) => true,
            Host::Tcp(name) => {
                name == "localhost"
                    || name
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
        }) && self.config.get_hostaddrs().iter().all(IpAddr::is_loopback)
    }
}

/// `url` without `sslmode` and `sslrootcert` in its query, and their
/// (decoded) values. A key=value string is returned as it is.
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return (url.to_owned(), None, None);
    };
    let (mut mode, mut root_cert, mut kept) = (None, None, Vec::new());
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = || percent_decode_str(value).decode_utf8_lossy().into_owned();
        match key {
            "sslmode" => mode = Some(value()),
            "sslrootcert" => root_cert = Some(value()),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rest, mode, root_cert)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_tls_parameters_are_taken_out_and_decoded() {
        let (rest, mode, root) = take_tls_params(
            "postgres://u@db:5432/shop?application_name=a&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u@db:5432/shop?application_name=a");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
    }

    #[test]
    fn a_key_value_string_keeps_what_tokio_postgres_reads() {
        let url = PgUrl::parse("host=db dbname=shop sslmode=require").expect("parses");
        assert_eq!(url.config.get_ssl_mode(), WireMode::Require);
        assert_eq!(url.mode, SslMode::Require);
    }

    #[test]
    fn an_unknown_sslmode_is_refused_by_name() {
        let error = PgUrl::parse("postgres://u@db/shop?sslmode=allow-ish").unwrap_err();
        assert!(error.to_string().contains("sslmode"), "{error}");
    }

    #[test]
    fn verify_ca_needs_a_root_certificate() {
        let error = PgUrl::parse("postgres://u@db/shop?sslmode=verify-ca").unwrap_err();
        assert!(matches!(error, UrlError::VerifyCaWithoutRoot), "{error}");
        let url = PgUrl::parse("postgres://u@db/shop?sslmode=verify-ca&sslrootcert=/ca.pem");
        assert!(url.is_ok());
        assert!(PgUrl::parse("postgres://u@db/shop?sslmode=verify-full").is_ok());
    }

    #[test]
    fn loopback_hosts_and_sockets_are_local_and_nothing_else() {
        for local in [
            "postgres://u@127.0.0.1/shop",
            "postgres://u@localhost:5433/shop",
            "postgres://u@[::1]/shop",
            "host=/var/run/postgresql dbname=shop",
            "postgres://u@127.0.0.1,localhost/shop",
        ] {
            assert!(PgUrl::parse(local).unwrap().is_local(), "{local}");
        }
        for remote in [
            "postgres://u@db.internal/shop",
            "postgres://u@10.0.0.5/shop",
            "postgres://u@127.0.0.1,db.internal/shop",
            "host=localhost hostaddr=10.0.0.5 dbname=shop",
        ] {
            assert!(!PgUrl::parse(remote).unwrap().is_local(), "{remote}");
        }
    }
}
