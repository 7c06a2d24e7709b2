//! The database, secret key and data directory of the commands that work on them directly,
//! without a server (`migrate`, `token`, `apply`, `config render|diff`, `image`). They find them
//! exactly as `plinth serve` does (`Settings`: `--config`, `PLINTH_CONFIG`, the system file, the
//! embedded defaults, then the flags), say on stderr which one they used (password redacted), and
//! a command that only reads creates nothing: it names what it looked for and how to point it
//! elsewhere.
//!
//! Also the settings flags (`SettingsArgs`) of those commands. Imports `app` (which names the
//! concrete store), `config`, `store::redact_url`, `images` and the services it hands out; no
//! other `cli` module.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;
use serde_json::json;

use crate::config::{Config, SecretKeySource, SettingsFile};
use crate::service::ports::Stores;
use crate::service::{ConfigService, Inventory, SecretBox};

/// The validated settings and where they came from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The validated configuration.
    pub config: Config,
    /// The file it was read from, if any.
    pub file: SettingsFile,
}

/// Where the settings and the database are, for the commands that use them. Accepted before
/// the command (`plinth --config F serve`) and after it (`plinth serve --config F`).
#[derive(Debug, Clone, Default, Args)]
pub struct SettingsArgs {
    /// Settings file (TOML; plinth.example.toml lists every key). Default: $PLINTH_CONFIG, else
    /// /etc/plinth/plinth.toml when it exists, else the embedded defaults (data in ./plinth-data).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (SQLite database, generated secret key, image cache); wins over the file.
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Database URL, sqlite://PATH or postgres://USER@HOST/DB; wins over the file [env:
    /// PLINTH_DATABASE_URL].
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,
}

impl SettingsArgs {
    /// These, with the values of `outer` (given before the command) where these have none.
    pub(crate) fn or(self, outer: &SettingsArgs) -> SettingsArgs {
        SettingsArgs {
            config: self.config.or_else(|| outer.config.clone()),
            data_dir: self.data_dir.or_else(|| outer.data_dir.clone()),
            database_url: self.database_url.or_else(|| outer.database_url.clone()),
        }
    }
}

/// The settings of a command that uses them (`Cli::settings` loads them for exactly those).
pub(crate) fn required(settings: Option<&Settings>) -> anyhow::Result<&Settings> {
    settings
        .ok_or_else(|| anyhow::anyhow!("this command needs the settings, and they were not loaded"))
}

/// Whether a command only reads (and so must create nothing) or may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only: a missing database, key or directory is an error, never created.
    Read,
    /// May write: creates the SQLite database and data directory as `plinth serve` does, and
    /// migrates.
    Write,
}

/// How to point a command at another database, for error messages.
const POINT_ELSEWHERE: &str = "point it at the server's with --config FILE (or PLINTH_CONFIG), \
     --data-dir DIR, or --database-url URL (or PLINTH_DATABASE_URL); without them Plinth reads \
     /etc/plinth/plinth.toml when it exists, else uses ./plinth-data in the current directory";

/// The file of a SQLite URL (`sqlite://PATH`, `sqlite:PATH`, with or without a query), or `None`
/// for PostgreSQL and in-memory databases.
pub(crate) fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or("");
    (!path.is_empty() && path != ":memory:").then(|| PathBuf::from(path))
}

/// A path as the user should read it: absolute (the current directory is what goes wrong).
fn shown(p: &Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// Say on stderr which database a command uses: text, or one JSON line with `--json`.
fn note_database(settings: &Settings, json_out: bool, created: bool) {
    let url = crate::store::redact_url(&settings.config.database_url);
    let file = sqlite_file(&settings.config.database_url).map(|f| shown(&f));
    if json_out {
        eprintln!(
            "{}",
            json!({"database": {"url": url, "file": file, "created": created, "settings": settings.file.to_string()}})
        );
        return;
    }
    let what = match &file {
        Some(f) => format!("SQLite {f}"),
        None => url,
    };
    if created {
        eprintln!(
            "plinth: database {what} (settings: {}) did not exist and was created now; if the server keeps its inventory elsewhere, {POINT_ELSEWHERE}",
            settings.file
        );
    } else {
        eprintln!("plinth: database {what} (settings: {})", settings.file);
    }
}

/// Open the database for `command` (e.g. `token list`), migrated when it may write: one handle
/// per port.
pub(crate) async fn store(
    settings: &Settings,
    access: Access,
    command: &str,
    json_out: bool,
) -> anyhow::Result<Stores> {
    let config = &settings.config;
    let file = sqlite_file(&config.database_url);
    let existed = file.as_deref().is_none_or(Path::exists);
    let store = match access {
        Access::Read => {
            if let (Some(f), false) = (&file, existed) {
                bail!(
                    "no database at {} (settings: {}): `plinth {command}` only reads, so it created nothing; {POINT_ELSEWHERE}",
                    shown(f),
                    settings.file
                );
            }
            crate::app::open_store_in_place(config, false).await?
        }
        // SQLite lives in the data directory, created as `plinth serve` creates it; PostgreSQL
        // needs no data directory.
        Access::Write if file.is_some() => crate::app::open_store(config, true).await?,
        Access::Write => crate::app::open_store_in_place(config, true).await?,
    };
    note_database(settings, json_out, !existed);
    Ok(store)
}

/// The secret key, checked against the database's fingerprint; a command that only reads never
/// creates it nor records its fingerprint.
pub(crate) async fn secret_box(
    settings: &Settings,
    stores: &crate::service::Stores,
    access: Access,
    command: &str,
) -> anyhow::Result<SecretBox> {
    if let (Access::Read, SecretKeySource::DataDir(p)) =
        (access, settings.config.require_secret_key()?)
    {
        if !p.exists() {
            bail!(
                "no secret key at {} (settings: {}): `plinth {command}` only reads, so it created nothing; the key is created beside the database by `plinth serve`; {POINT_ELSEWHERE}",
                shown(p),
                settings.file
            );
        }
    }
    crate::app::checked_secret_box(&settings.config, stores, access == Access::Write).await
}

/// The config service and the inventory on the configured database and secret key.
pub(crate) async fn services(
    settings: &Settings,
    access: Access,
    command: &str,
    json_out: bool,
) -> anyhow::Result<(ConfigService, Inventory)> {
    // The key's absence is a settings error: say it before touching the database.
    settings.config.require_secret_key()?;
    let stores = store(settings, access, command, json_out).await?;
    let secrets = secret_box(settings, &stores, access, command).await?;
    Ok((
        crate::app::config_service(
            &stores,
            secrets.clone(),
            settings.config.talos_schema_dir.clone(),
        ),
        crate::app::inventory(&stores, secrets),
    ))
}

/// The image cache in the data directory; a command that only reads needs it to exist.
pub(crate) fn image_cache(
    settings: &Settings,
    access: Access,
    command: &str,
    json_out: bool,
) -> anyhow::Result<crate::images::ImageCache> {
    let dir = settings.config.data_dir.join("images");
    if access == Access::Read && !dir.is_dir() {
        bail!(
            "no image cache at {} (settings: {}): `plinth {command}` only reads, so it created nothing; {POINT_ELSEWHERE}",
            shown(&dir),
            settings.file
        );
    }
    if json_out {
        eprintln!(
            "{}",
            json!({"image_cache": {"dir": shown(&dir), "settings": settings.file.to_string()}})
        );
    } else {
        eprintln!(
            "plinth: image cache {} (settings: {})",
            shown(&dir),
            settings.file
        );
    }
    Ok(crate::images::ImageCache::new(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_file_of_urls() {
        for (url, want) in [
            (
                "sqlite://./plinth-data/plinth.db",
                Some("./plinth-data/plinth.db"),
            ),
            (
                "sqlite:///var/lib/plinth/plinth.db",
                Some("/var/lib/plinth/plinth.db"),
            ),
            ("sqlite:x.db?mode=rwc", Some("x.db")),
            ("sqlite::memory:", None),
            ("postgres://u:p@h/db", None),
        ] {
            assert_eq!(sqlite_file(url), want.map(PathBuf::from), "{url}");
        }
    }
}
