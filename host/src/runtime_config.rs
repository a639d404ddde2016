//! Spin's runtime configuration file (`spin up --runtime-config-file PATH`): which backend
//! serves each SQLite database and key-value store label.
//!
//! The schema is Spin's:
//!
//! ```toml
//! [sqlite_database.default]
//! type = "libsql"                      # or "spin" with an optional `path`
//! url = "http://127.0.0.1:8080"        # http:// or https:// (this host: http:// only)
//! token = "…"                          # sent as a bearer token; may be empty
//!
//! [key_value_store.default]
//! type = "redis"                       # or "spin" with an optional `path`
//! url = "redis://127.0.0.1:6379"
//!
//! [outbound_http]
//! connection_pooling = true            # Spin 3.4+: false unless said when the section is given
//! ```
//!
//! Without an `[outbound_http]` section connections are pooled, as in Spin.
//!
//! As in Spin, a label the file does not define that is `default` gets the local file in the
//! state directory (`sqlite_db.db`, `sqlite_key_value.db`); a `spin` database's relative
//! `path` is resolved against the working directory and a `spin` key-value store's against
//! the file's directory; `state_dir` may be set in the file (the command line wins). Any
//! other top-level key, an unknown `type` or an unknown field is an error at start, as is a
//! label a component uses that nothing defines. Spin's in-memory stores (`type = "spin"`
//! without `path` in a file) are not offered: this host needs a `path` there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// The label every Spin app can use without a runtime config.
pub const DEFAULT_LABEL: &str = "default";
/// The default database's file in the state directory (Spin's name).
pub const DEFAULT_SQLITE_FILE: &str = "sqlite_db.db";
/// The default key-value store's file in the state directory (Spin's name).
pub const DEFAULT_KEY_VALUE_FILE: &str = "sqlite_key_value.db";

/// What serves one SQLite database label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SqliteDatabase {
    /// `type = "spin"`: a local SQLite file.
    Local { path: PathBuf },
    /// `type = "libsql"`: a libSQL server (sqld, Turso) over HTTP.
    Libsql { url: String, token: String },
}

/// What serves one key-value store label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValueStore {
    /// `type = "spin"`: Spin's SQLite-file store.
    Local { path: PathBuf },
    /// `type = "redis"`: plain Redis commands on one server.
    Redis { url: String },
}

/// A parsed runtime config, before the defaults are added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub sqlite_databases: BTreeMap<String, SqliteDatabase>,
    pub key_value_stores: BTreeMap<String, KeyValueStore>,
    /// `state_dir = "…"` in the file (absolute; relative to the working directory).
    pub state_dir: Option<PathBuf>,
    /// Whether outbound HTTP keeps connections for reuse (`[outbound_http]`).
    pub outbound_http_pooling: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            sqlite_databases: BTreeMap::new(),
            key_value_stores: BTreeMap::new(),
            state_dir: None,
            outbound_http_pooling: true,
        }
    }
}

/// `[outbound_http]`: Spin's section, whose `connection_pooling` defaults to false once the
/// section is given. Spin's `max_connections` is not offered by this host.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutboundHttp {
    #[serde(default)]
    connection_pooling: bool,
}

#[derive(Deserialize)]
struct Typed {
    #[serde(rename = "type")]
    type_: String,
    #[serde(flatten)]
    config: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalFile {
    path: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalDatabase {
    path: Option<PathBuf>,
    /// Spin's switch for `ATTACH`ing existing files; this host never allows it.
    #[serde(default)]
    allow_attach_file: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LibsqlDatabase {
    url: String,
    token: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedisStore {
    url: String,
}

impl RuntimeConfig {
    /// Reads and checks a runtime config file.
    pub fn load(path: &Path) -> anyhow::Result<RuntimeConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read runtime config file '{}'", path.display()))?;
        let table: toml::Table = text.parse().with_context(|| {
            format!(
                "failed to parse runtime config file '{}' as toml",
                path.display()
            )
        })?;
        let config_dir = std::path::absolute(
            path.parent()
                .filter(|dir| !dir.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        )
        .context("cannot resolve the runtime config file's directory")?;
        let working_dir =
            std::env::current_dir().context("failed to get current working directory")?;
        RuntimeConfig::from_table(table, &config_dir, &working_dir)
            .with_context(|| format!("runtime config file '{}'", path.display()))
    }

    /// Checks a parsed file. `config_dir` resolves key-value paths, `working_dir` database
    /// paths and `state_dir`, as Spin does.
    pub fn from_table(
        mut table: toml::Table,
        config_dir: &Path,
        working_dir: &Path,
    ) -> anyhow::Result<RuntimeConfig> {
        let mut config = RuntimeConfig::default();
        if let Some(state_dir) = table.remove("state_dir") {
            let Some(state_dir) = state_dir.as_str() else {
                bail!("state_dir must be a string");
            };
            if !state_dir.is_empty() {
                config.state_dir = Some(resolve(Path::new(state_dir), working_dir));
            }
        }
        if let Some(databases) = table.remove("sqlite_database") {
            for (label, typed) in labelled(databases, "sqlite_database")? {
                let database = sqlite_database(typed, working_dir)
                    .with_context(|| format!("[sqlite_database.{label}]"))?;
                config.sqlite_databases.insert(label, database);
            }
        }
        if let Some(stores) = table.remove("key_value_store") {
            for (label, typed) in labelled(stores, "key_value_store")? {
                let store = key_value_store(typed, config_dir).with_context(|| {
                    format!("could not configure key-value store with label '{label}'")
                })?;
                config.key_value_stores.insert(label, store);
            }
        }
        if let Some(outbound) = table.remove("outbound_http") {
            let outbound: OutboundHttp = outbound.try_into().context("[outbound_http]")?;
            config.outbound_http_pooling = outbound.connection_pooling;
        }
        if !table.is_empty() {
            let keys: Vec<&str> = table.keys().map(String::as_str).collect();
            bail!("unused runtime config key(s): {}", keys.join(", "));
        }
        Ok(config)
    }

    /// Whether a component may use the database `label`: `default` always exists.
    pub fn defines_sqlite_database(&self, label: &str) -> bool {
        label == DEFAULT_LABEL || self.sqlite_databases.contains_key(label)
    }

    /// Whether a component may use the key-value store `label`: `default` always exists.
    pub fn defines_key_value_store(&self, label: &str) -> bool {
        label == DEFAULT_LABEL || self.key_value_stores.contains_key(label)
    }

    /// The database behind `label`: the file's, or for `default` the state directory's file.
    pub fn sqlite_database(&self, label: &str, state_dir: &Path) -> Option<SqliteDatabase> {
        match self.sqlite_databases.get(label) {
            Some(database) => Some(database.clone()),
            None if label == DEFAULT_LABEL => Some(SqliteDatabase::Local {
                path: state_dir.join(DEFAULT_SQLITE_FILE),
            }),
            None => None,
        }
    }

    /// The store behind `label`: the file's, or for `default` the state directory's file.
    pub fn key_value_store(&self, label: &str, state_dir: &Path) -> Option<KeyValueStore> {
        match self.key_value_stores.get(label) {
            Some(store) => Some(store.clone()),
            None if label == DEFAULT_LABEL => Some(KeyValueStore::Local {
                path: state_dir.join(DEFAULT_KEY_VALUE_FILE),
            }),
            None => None,
        }
    }

    /// One line per configured label, for the start-up banner: `[sqlite_database.default: libsql]`.
    pub fn summary(&self) -> Vec<String> {
        let kv = self.key_value_stores.iter().map(|(label, store)| {
            let kind = match store {
                KeyValueStore::Local { .. } => "spin",
                KeyValueStore::Redis { .. } => "redis",
            };
            format!("[key_value_store.{label}: {kind}]")
        });
        let sqlite = self.sqlite_databases.iter().map(|(label, database)| {
            let kind = match database {
                SqliteDatabase::Local { .. } => "spin",
                SqliteDatabase::Libsql { .. } => "libsql",
            };
            format!("[sqlite_database.{label}: {kind}]")
        });
        kv.chain(sqlite).collect()
    }
}

/// The `<label> → { type = …, … }` tables under `key`.
fn labelled(value: toml::Value, key: &str) -> anyhow::Result<Vec<(String, Typed)>> {
    let toml::Value::Table(tables) = value else {
        bail!("{key} must be a table of labelled tables ([{key}.<label>])");
    };
    tables
        .into_iter()
        .map(|(label, value)| {
            let typed: Typed = value
                .try_into()
                .with_context(|| format!("[{key}.{label}]"))?;
            Ok((label, typed))
        })
        .collect()
}

fn sqlite_database(typed: Typed, working_dir: &Path) -> anyhow::Result<SqliteDatabase> {
    match typed.type_.as_str() {
        "spin" => {
            let local: LocalDatabase = decode(typed.config)?;
            if local.allow_attach_file {
                bail!("allow_attach_file = true is not supported by this host");
            }
            let Some(path) = local.path else {
                bail!(
                    "an in-memory database (type \"spin\" without `path`) is not supported by this host: give a path"
                );
            };
            Ok(SqliteDatabase::Local {
                path: resolve(&path, working_dir),
            })
        }
        "libsql" => {
            let libsql: LibsqlDatabase = decode(typed.config)?;
            check_libsql_url(&libsql.url).with_context(|| {
                format!(
                    "unexpected libSQL URL '{}' in runtime config file",
                    libsql.url
                )
            })?;
            Ok(SqliteDatabase::Libsql {
                url: libsql.url,
                token: libsql.token,
            })
        }
        other => bail!("Unknown database kind: {other}"),
    }
}

fn check_libsql_url(url: &str) -> anyhow::Result<()> {
    if url.starts_with("https://") {
        bail!(
            "this host talks to libSQL over plain http:// only (for TLS, run the app with Spin itself)"
        );
    }
    if !url.starts_with("http://") {
        bail!(
            "URL does not start with 'https://' or 'http://'. Spin currently only supports talking to libSQL databases over HTTP(S)"
        );
    }
    Ok(())
}

fn key_value_store(typed: Typed, config_dir: &Path) -> anyhow::Result<KeyValueStore> {
    match typed.type_.as_str() {
        "spin" => {
            let local: LocalFile =
                decode(typed.config).context("could not parse key-value runtime config")?;
            let Some(path) = local.path else {
                bail!(
                    "an in-memory store (type \"spin\" without `path`) is not supported by this host: give a path"
                );
            };
            Ok(KeyValueStore::Local {
                path: resolve(&path, config_dir),
            })
        }
        "redis" => {
            let redis: RedisStore =
                decode(typed.config).context("could not parse key-value runtime config")?;
            redis::Client::open(redis.url.as_str()).context("Invalid Redis URL")?;
            Ok(KeyValueStore::Redis { url: redis.url })
        }
        other => {
            bail!("the store type '{other}' was not registered with the config resolver")
        }
    }
}

fn decode<T: DeserializeOwned>(table: toml::Table) -> Result<T, toml::de::Error> {
    toml::Value::Table(table).try_into()
}

fn resolve(path: &Path, base: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        base.join(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<RuntimeConfig> {
        RuntimeConfig::from_table(
            text.parse().expect("toml"),
            Path::new("/etc/app"),
            Path::new("/work"),
        )
    }

    fn error(text: &str) -> String {
        let e = parse(text).expect_err("must be refused");
        e.chain()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(": ")
    }

    #[test]
    fn an_empty_file_leaves_the_defaults_in_the_state_directory() {
        let config = parse("").unwrap();
        let state = Path::new("/state");
        assert_eq!(
            config.sqlite_database("default", state),
            Some(SqliteDatabase::Local {
                path: state.join("sqlite_db.db")
            })
        );
        assert_eq!(
            config.key_value_store("default", state),
            Some(KeyValueStore::Local {
                path: state.join("sqlite_key_value.db")
            })
        );
        assert_eq!(config.sqlite_database("other", state), None);
        assert_eq!(config.key_value_store("other", state), None);
    }

    #[test]
    fn libsql_and_redis_serve_their_labels() {
        let config = parse(
            r#"
            [sqlite_database.default]
            type = "libsql"
            url = "http://127.0.0.1:8080"
            token = ""

            [key_value_store.default]
            type = "redis"
            url = "redis://127.0.0.1:6379"

            [key_value_store.cache]
            type = "spin"
            path = "cache.db"

            [sqlite_database.reports]
            type = "spin"
            path = "reports.db"
            "#,
        )
        .unwrap();
        let state = Path::new("/state");
        assert_eq!(
            config.sqlite_database("default", state),
            Some(SqliteDatabase::Libsql {
                url: "http://127.0.0.1:8080".into(),
                token: String::new()
            })
        );
        assert_eq!(
            config.key_value_store("default", state),
            Some(KeyValueStore::Redis {
                url: "redis://127.0.0.1:6379".into()
            })
        );
        // Spin resolves a key-value path against the file's directory, a database path
        // against the working directory.
        assert_eq!(
            config.key_value_store("cache", state),
            Some(KeyValueStore::Local {
                path: "/etc/app/cache.db".into()
            })
        );
        assert_eq!(
            config.sqlite_database("reports", state),
            Some(SqliteDatabase::Local {
                path: "/work/reports.db".into()
            })
        );
        assert_eq!(
            config.summary(),
            vec![
                "[key_value_store.cache: spin]",
                "[key_value_store.default: redis]",
                "[sqlite_database.default: libsql]",
                "[sqlite_database.reports: spin]",
            ]
        );
    }

    #[test]
    fn state_dir_may_be_set_in_the_file() {
        let config = parse("state_dir = \"data\"").unwrap();
        assert_eq!(config.state_dir, Some(PathBuf::from("/work/data")));
        assert_eq!(parse("state_dir = \"\"").unwrap().state_dir, None);
    }

    #[test]
    fn outbound_http_pools_unless_a_section_says_otherwise_as_in_spin() {
        assert!(parse("").unwrap().outbound_http_pooling);
        assert!(!parse("[outbound_http]").unwrap().outbound_http_pooling);
        assert!(
            parse("[outbound_http]\nconnection_pooling = true")
                .unwrap()
                .outbound_http_pooling
        );
        let refused = parse("[outbound_http]\nmax_connections = 4").unwrap_err();
        assert!(
            format!("{refused:#}").contains("unknown field `max_connections`"),
            "{refused:#}"
        );
    }

    #[test]
    fn unknown_keys_types_and_fields_are_refused_with_one_line() {
        let cases = [
            ("baz = 1", "unused runtime config key(s): baz"),
            (
                "[sqlite_database.default]\ntype = \"postgres\"",
                "[sqlite_database.default]: Unknown database kind: postgres",
            ),
            (
                "[key_value_store.default]\ntype = \"memcached\"",
                "could not configure key-value store with label 'default': the store type 'memcached' was not registered with the config resolver",
            ),
            (
                "[sqlite_database.default]\ntype = \"libsql\"\nurl = \"http://x\"\ntoken = \"\"\ncolor = \"red\"",
                "unknown field `color`",
            ),
            (
                "[key_value_store.default]\ntype = \"redis\"\nurl = \"redis://x\"\ndb = 2",
                "unknown field `db`",
            ),
            (
                "[sqlite_database.default]\ntype = \"libsql\"\nurl = \"http://x\"",
                "missing field `token`",
            ),
            (
                "[sqlite_database.default]\ntype = \"libsql\"\nurl = \"libsql://x\"\ntoken = \"\"",
                "URL does not start with 'https://' or 'http://'",
            ),
            (
                "[key_value_store.default]\ntype = \"redis\"\nurl = \"http://x\"",
                "Invalid Redis URL",
            ),
            (
                "[sqlite_database.default]\npath = \"x\"",
                "missing field `type`",
            ),
            (
                "[key_value_store.default]\ntype = \"spin\"",
                "in-memory store",
            ),
        ];
        for (text, expected) in cases {
            let message = error(text);
            assert!(
                message.contains(expected),
                "{text:?}: {message:?} lacks {expected:?}"
            );
        }
    }
}
