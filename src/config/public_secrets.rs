//! The secrets this repository publishes (`public_secrets.txt`), which
//! production refuses: anyone who has read the repository could mint a
//! token for any buyer, sign Payrail's events or log in to the database
//! with one of them. Kept as hashes, so the binary holds none of them.

use sha2::{Digest, Sha256};

const LIST: &str = include_str!("public_secrets.txt");

/// Whether `value`, or a piece of it between a URL's or a connection
/// string's separators (a password in `database.url`), is published here.
pub(super) fn holds(value: &str) -> bool {
    std::iter::once(value)
        .chain(value.split([':', '/', '@', '?', '&', '=', ' ', '\'']))
        .filter(|piece| !piece.is_empty())
        .any(|piece| listed().any(|hash| hash == sha256_hex(piece)))
}

fn listed() -> impl Iterator<Item = &'static str> {
    LIST.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_whitespace().next())
}

fn sha256_hex(value: &str) -> String {
    Sha256::digest(value.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn every_secret_the_repository_holds_is_listed() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut missing = Vec::new();
        let mut found = 0;
        for file in text_files(root) {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let rust = file.extension().is_some_and(|ext| ext == "rs");
            for (number, line) in text.lines().enumerate() {
                for value in secret_looking_values(line, rust) {
                    found += 1;
                    if !holds(value) {
                        missing.push(format!(
                            "{} {}:{}",
                            sha256_hex(value),
                            file.strip_prefix(root).unwrap_or(&file).display(),
                            number + 1
                        ));
                    }
                }
            }
        }
        assert!(
            found >= 3,
            "the scan found only {found} secrets: is it broken?"
        );
        assert!(
            missing.is_empty(),
            "secrets in the repository that production would accept; add these lines \
             to src/config/public_secrets.txt:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn the_scan_finds_secrets_as_each_kind_of_file_writes_them() {
        let cases = [
            ("jwt_secret = \"s3cr3t-value\"", false, Some("s3cr3t-value")),
            (
                "  API_KEY: ${X_API_KEY:-sk_test_fallback}",
                false,
                Some("sk_test_fallback"),
            ),
            (
                "url: postgres://u:${DB_PASSWORD:-pw-fallback-1}@db/x",
                false,
                Some("pw-fallback-1"),
            ),
            (
                "STAGEDOOR__AUTH__JWT_SECRET=from-a-doc-example",
                false,
                Some("from-a-doc-example"),
            ),
            (
                "pub const WEBHOOK_SECRET: &str = \"whsec_in_a_test\";",
                true,
                Some("whsec_in_a_test"),
            ),
            ("jwt_secret = \"\"", false, None),
            (
                "STAGEDOOR__AUTH__JWT_SECRET_FILE=/run/secrets/jwt",
                false,
                None,
            ),
            (
                "| `payrail.webhook_secret` | at least 32 bytes |",
                false,
                None,
            ),
            ("let secret = settings.payrail.webhook_secret;", true, None),
        ];
        for (line, rust, expected) in cases {
            assert_eq!(
                secret_looking_values(line, rust).first().copied(),
                expected,
                "{line}"
            );
        }
    }

    #[test]
    fn a_published_secret_is_found_whole_or_as_a_password() {
        assert!(holds("dev-only-secret-change-me-dev-only-secret"));
        assert!(holds(
            "postgres://stagedoor:stagedoor-dev-only-password@postgres:5432/stagedoor"
        ));
        assert!(holds("host=db password='stagedoor-dev-only-password'"));
        assert!(!holds(
            "postgres://stagedoor:an-unpublished-one@db/stagedoor"
        ));
        assert!(!holds(""));
    }

    /// The repository's text files, without build output or dependencies.
    fn text_files(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return files;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !matches!(name.as_ref(), "target" | ".git" | "node_modules" | "corpus") {
                    files.extend(text_files(&path));
                }
            } else if !matches!(
                path.extension().and_then(|ext| ext.to_str()),
                Some("lock" | "png" | "svg" | "ico" | "woff2")
            ) && !name.ends_with("public_secrets.txt")
            {
                files.push(path);
            }
        }
        files
    }

    /// The values a line gives a name that says it is a secret (`secret`,
    /// `api_key`, `password`): `name = "v"`, `NAME: v`, `NAME=v`, a compose
    /// fallback `${NAME:-v}`; in Rust, only `const NAME: &str = "v"`, since
    /// code names secrets everywhere without holding one. Paths, URLs and
    /// values under 8 bytes are no secrets.
    fn secret_looking_values(line: &str, rust: bool) -> Vec<&str> {
        let lower = line.to_ascii_lowercase();
        let is_secret_name = |name: &str| {
            ["secret", "api_key", "api-key", "password"]
                .iter()
                .any(|m| name.contains(m))
        };
        if rust {
            let Some((head, literal)) = line.split_once(": &str = \"") else {
                return Vec::new();
            };
            let name = head
                .rsplit(' ')
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if !head.contains("const ") || !is_secret_name(&name) {
                return Vec::new();
            }
            return literal.split('"').next().into_iter().collect();
        }
        let mut values = Vec::new();
        let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        let mut start = 0;
        while start < line.len() {
            let Some(name_start) = lower[start..]
                .find(|c: char| is_name_char(c))
                .map(|i| i + start)
            else {
                break;
            };
            let name_end = lower[name_start..]
                .find(|c: char| !is_name_char(c))
                .map_or(line.len(), |i| i + name_start);
            start = name_end.max(name_start + 1);
            if !is_secret_name(&lower[name_start..name_end]) {
                continue;
            }
            let rest = line[name_end..]
                .trim_start_matches(['"', '\'', '`'])
                .trim_start();
            let Some(rest) = rest.strip_prefix(['=', ':']) else {
                continue;
            };
            let rest = rest.strip_prefix('-').unwrap_or(rest).trim_start();
            let rest = match rest.strip_prefix("${") {
                Some(inner) => inner.split_once(":-").map_or("", |(_, fallback)| fallback),
                None => rest,
            };
            let rest = rest.trim_start_matches(['"', '\'']);
            let value = rest
                .split(|c: char| c.is_whitespace() || "\"'`},;)".contains(c))
                .next()
                .unwrap_or_default();
            if value.len() >= 8
                && !value.starts_with(['/', '.', '$', '&'])
                && !value.contains("://")
                && !value.contains('(')
            {
                values.push(value);
            }
        }
        values
    }
}
