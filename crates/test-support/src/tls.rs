//! A throwaway PostgreSQL that speaks TLS only: `ssl = on` with a server
//! certificate made by `openssl` at test time (for `localhost` and
//! 127.0.0.1, signed by a CA of the test's own), and a `pg_hba.conf` that
//! rejects every TCP connection without TLS. Plus a second CA that signed
//! nothing, for a certificate that must not verify.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::postgres::{running_as_root, Postgres, SCRATCH_PREFIX};
use crate::scratch::ScratchDir;

/// Only the unix socket (the server's own directory, for `pg_ctl`) takes
/// connections without TLS.
const HBA: &str = "\
local all all trust
hostnossl all all 0.0.0.0/0 reject
hostnossl all all ::/0 reject
hostssl all all 127.0.0.1/32 trust
hostssl all all ::1/128 trust
";

/// The server certificate's names, as a client connecting to either checks.
const SERVER_NAMES: &str = "subjectAltName=DNS:localhost,IP:127.0.0.1
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
";

/// The server's certificate.
#[derive(Debug, Clone, Copy)]
pub enum Certificate {
    /// For `localhost` and 127.0.0.1, signed by [`TlsPostgres::ca`].
    SignedByCa,
    /// Self-signed, X.509 version 1 with no extensions: what Citus makes
    /// for its nodes, and what the web PKI cannot parse.
    SelfSignedV1,
}

/// The server and its certificates; dropped, the server stops and its
/// directory goes.
#[derive(Debug)]
pub struct TlsPostgres {
    // Declared first: stopped before its directory is removed.
    server: Postgres,
    scratch: ScratchDir,
}

impl TlsPostgres {
    /// `Err` says why it cannot be had here (no `initdb`, no `openssl`).
    pub fn start() -> Result<Self, String> {
        Self::start_with(Certificate::SignedByCa)
    }

    pub fn start_with(certificate: Certificate) -> Result<Self, String> {
        let scratch = ScratchDir::new(SCRATCH_PREFIX).map_err(|e| format!("scratch dir: {e}"))?;
        let tls = scratch.path().join("tls");
        fs::create_dir(&tls).map_err(|e| format!("{}: {e}", tls.display()))?;
        make_ca(&tls, "ca")?;
        make_ca(&tls, "other-ca")?;
        openssl(
            &tls,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
        )?;
        let signing: &[&str] = match certificate {
            Certificate::SignedByCa => {
                write(&tls.join("server.ext"), SERVER_NAMES)?;
                &[
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-extfile",
                    "server.ext",
                ]
            }
            // Without extensions, `openssl x509` writes version 1.
            Certificate::SelfSignedV1 => &["-signkey", "server.key"],
        };
        let mut args = vec!["x509", "-req", "-in", "server.csr", "-days", "2"];
        args.extend_from_slice(signing);
        args.extend_from_slice(&["-out", "server.pem"]);
        openssl(&tls, &args)?;
        write(&tls.join("pg_hba.conf"), HBA)?;
        // The server refuses a key that others may read, or that is not
        // its user's.
        let key = tls.join("server.key");
        if running_as_root() {
            run(Command::new("chown").arg("postgres:postgres").arg(&key))?;
        }
        run(Command::new("chmod").arg("600").arg(&key))?;
        let settings = [
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", tls.join("server.pem").display()),
            format!("ssl_key_file={}", key.display()),
            format!("hba_file={}", tls.join("pg_hba.conf").display()),
        ];
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let server = Postgres::start_in(scratch.path(), &settings)?;
        Ok(Self { server, scratch })
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `postgres://postgres@<host>:PORT/<database>?<params>` (no `?` when
    /// `params` is empty).
    pub fn url(&self, host: &str, database: &str, params: &str) -> String {
        let query = if params.is_empty() { "" } else { "?" };
        format!(
            "postgres://postgres@{host}:{}/{database}{query}{params}",
            self.server.port()
        )
    }

    /// The CA that signed the server's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.scratch.path().join("tls").join("ca.pem")
    }

    /// A CA that signed nothing the server has.
    pub fn other_ca(&self) -> PathBuf {
        self.scratch.path().join("tls").join("other-ca.pem")
    }
}

/// A self-signed CA, `<name>.pem` and `<name>.key` in `dir`.
fn make_ca(dir: &Path, name: &str) -> Result<(), String> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=stagedoor test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    )
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    run(Command::new("openssl").args(args).current_dir(dir))
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
