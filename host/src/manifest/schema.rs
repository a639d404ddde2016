//! `spin.toml` version 2 as serde types, named as Spin's own manifest schema names them.
//!
//! Every table refuses fields it does not know (`deny_unknown_fields`), as Spin does, so a
//! typo such as `key_value_store` is an error instead of a store silently taken away. The
//! only open table is a trigger's own settings ([`Trigger::config`]): each trigger type reads
//! them into its own type ([`HttpTriggerConfig`] for `[[trigger.http]]`), which again
//! refuses unknown fields.
//!
//! These types only say what the file holds; [`super::Manifest`] checks what they mean
//! (ids, names, references) and resolves paths.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppManifest {
    /// `spin_manifest_version = 2`.
    pub spin_manifest_version: ManifestVersion,
    /// `[application]`.
    pub application: AppDetails,
    /// `[variables]`: application variables by name.
    #[serde(default)]
    pub variables: BTreeMap<String, Variable>,
    /// `[[trigger.<type>]]`, by trigger type.
    #[serde(rename = "trigger")]
    pub triggers: BTreeMap<String, Vec<Trigger>>,
    /// `[component.<id>]`.
    #[serde(rename = "component", default)]
    pub components: BTreeMap<String, Component>,
}

/// `spin_manifest_version`: only 2 is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestVersion;

impl<'de> Deserialize<'de> for ManifestVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(deserializer)? {
            toml::Value::Integer(2) => Ok(ManifestVersion),
            toml::Value::String(v) if v == "1" => Err(D::Error::custom(
                "manifest version 1 is not supported; use `spin_manifest_version = 2`",
            )),
            other => Err(D::Error::custom(format!("must be 2, found {other}"))),
        }
    }
}

/// `[application]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppDetails {
    pub name: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub authors: Vec<String>,
    /// Deployment environments to check the app against (not used by this host).
    #[serde(default)]
    pub targets: Vec<toml::Value>,
    /// Application-wide settings per trigger type (not used by this host).
    #[serde(rename = "trigger", default)]
    pub trigger_global_configs: BTreeMap<String, toml::Table>,
    /// Settings for external tools.
    #[serde(default)]
    pub tool: BTreeMap<String, toml::Table>,
}

/// One application variable: a `default`, or `required = true`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variable {
    #[serde(default)]
    pub required: bool,
    pub default: Option<String>,
    #[serde(default)]
    pub secret: bool,
    pub description: Option<String>,
}

/// One `[[trigger.<type>]]`.
#[derive(Clone, Debug, Deserialize)]
pub struct Trigger {
    #[serde(default)]
    pub id: String,
    /// The component to run: an id from `[component]`, or one written inline.
    pub component: Option<ComponentSpec>,
    /// The trigger type's own settings (for HTTP: [`HttpTriggerConfig`]).
    #[serde(flatten)]
    pub config: toml::Table,
}

/// A trigger's component: a reference by id, or an inline component table.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged, expecting = "a component id, or an inline component table")]
pub enum ComponentSpec {
    Reference(String),
    Inline(toml::Table),
}

/// The settings of an HTTP trigger.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTriggerConfig {
    pub route: HttpRoute,
    pub executor: Option<HttpExecutor>,
}

/// `route = "/path/..."`, or `route = { private = true }` (reachable only from other components).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(
    untagged,
    expecting = "a route pattern such as \"/api/...\", or `{ private = true }`"
)]
pub enum HttpRoute {
    Pattern(String),
    Private(PrivateRoute),
}

/// `{ private = true }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivateRoute {
    pub private: bool,
}

/// `executor = { type = "spin" }` (the default), `"wagi"`, …
#[derive(Clone, Debug, Deserialize)]
pub struct HttpExecutor {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    pub settings: toml::Table,
}

/// `[component.<id>]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    pub source: ComponentSource,
    #[serde(default)]
    pub description: String,
    /// Component variables: templates over application variables.
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    #[serde(default)]
    pub files: Vec<toml::Value>,
    #[serde(default)]
    pub exclude_files: Vec<String>,
    #[serde(default)]
    pub allowed_http_hosts: Vec<String>,
    #[serde(default)]
    pub allowed_outbound_hosts: Vec<String>,
    #[serde(default)]
    pub key_value_stores: Vec<String>,
    #[serde(default)]
    pub sqlite_databases: Vec<String>,
    #[serde(default)]
    pub ai_models: Vec<String>,
    pub targets: Option<Vec<toml::Value>>,
    pub build: Option<ComponentBuildConfig>,
    #[serde(default)]
    pub tool: BTreeMap<String, toml::Table>,
    pub dependencies_inherit_configuration: Option<bool>,
    #[serde(default)]
    pub dependencies: toml::Table,
    #[serde(default)]
    pub profile: BTreeMap<String, toml::Table>,
}

/// Where the component's Wasm comes from.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged, expecting = "a path to a .wasm file")]
pub enum ComponentSource {
    /// A local file, relative to the manifest's directory.
    Local(String),
    /// A URL with a digest, or a registry package (not supported by this host).
    Remote(toml::Table),
}

/// `[component.<id>.build]`: how `spin build` builds the component.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentBuildConfig {
    pub command: BuildCommands,
    pub workdir: Option<String>,
    #[serde(default)]
    pub watch: Vec<String>,
}

/// One build command, or several run in order.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged, expecting = "a command, or a list of commands")]
pub enum BuildCommands {
    One(String),
    Many(Vec<String>),
}

impl BuildCommands {
    /// The commands joined with ` && `, as one shell line.
    pub fn as_one_line(&self) -> String {
        match self {
            BuildCommands::One(command) => command.clone(),
            BuildCommands::Many(commands) => commands.join(" && "),
        }
    }
}
