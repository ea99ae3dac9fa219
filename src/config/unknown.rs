//! The keys a layer sets that no setting declares: each named with where it
//! was set (a variable or a file) and the nearest key the built-in defaults
//! declare, so that a typo stops the service instead of being ignored.

use std::path::PathBuf;

use config::{Config, File, FileFormat, Value, ValueKind};

use super::{
    environment_variables, ConfigError, FileVariable, DEFAULT_LAYER, ENV_PREFIX, ENV_SEPARATOR,
};

/// A key some layer sets that no setting declares.
#[derive(Debug)]
pub struct UnknownKey {
    pub key: String,
    /// Where it was set: a variable's name or a file's path.
    pub origin: String,
    pub nearest: Option<String>,
}

impl std::fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown configuration key `{}` (set by {})",
            self.key, self.origin
        )?;
        match &self.nearest {
            Some(nearest) => write!(f, "; the nearest known key is `{nearest}`"),
            None => Ok(()),
        }
    }
}

/// Names each key the settings ignored (a whole unknown section by its
/// keys), where it was set, and the nearest key the defaults declare.
pub(super) fn keys(
    layered: &Config,
    ignored: &[String],
    files: &[PathBuf],
    from_files: &[FileVariable],
) -> Result<Vec<UnknownKey>, ConfigError> {
    let known = leaf_keys(
        &Config::builder()
            .add_source(File::from_str(DEFAULT_LAYER, FileFormat::Toml))
            .build()?
            .cache,
    );
    let variables = Config::builder()
        .add_source(environment_variables()?)
        .build()?;
    let mut unknown = Vec::new();
    for path in ignored {
        let value = layered.get::<Value>(path)?;
        for key in leaf_keys(&value).into_iter().map(|leaf| join(path, &leaf)) {
            let from_file = from_files.iter().find(|variable| variable.key == key);
            let origin = if let Some(from_file) = from_file {
                from_file.variable.clone()
            } else if variables.get::<Value>(&key).is_ok() {
                format!(
                    "{ENV_PREFIX}{ENV_SEPARATOR}{}",
                    key.to_uppercase().replace('.', ENV_SEPARATOR)
                )
            } else {
                files
                    .iter()
                    .find(|file| {
                        Config::builder()
                            .add_source(File::from(file.as_path()).required(false))
                            .build()
                            .is_ok_and(|layer| layer.get::<Value>(&key).is_ok())
                    })
                    .map_or_else(
                        || "a configuration file".to_owned(),
                        |file| file.display().to_string(),
                    )
            };
            let nearest = known
                .iter()
                .map(|candidate| (strsim::levenshtein(&key, candidate), candidate))
                .min()
                .filter(|(distance, _)| *distance <= key.len().max(4) / 2)
                .map(|(_, candidate)| candidate.clone());
            unknown.push(UnknownKey {
                key,
                origin,
                nearest,
            });
        }
    }
    Ok(unknown)
}

/// The dotted paths of a value's leaves (`""` for a leaf itself).
fn leaf_keys(value: &Value) -> Vec<String> {
    match &value.kind {
        ValueKind::Table(table) => table
            .iter()
            .flat_map(|(name, child)| {
                leaf_keys(child)
                    .into_iter()
                    .map(move |leaf| join(name, &leaf))
            })
            .collect(),
        _ => vec![String::new()],
    }
}

fn join(parent: &str, child: &str) -> String {
    match (parent.is_empty(), child.is_empty()) {
        (_, true) => parent.to_owned(),
        (true, false) => child.to_owned(),
        (false, false) => format!("{parent}.{child}"),
    }
}
