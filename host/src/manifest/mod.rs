//! `spin.toml` (manifest version 2): read into the serde types of [`schema`], then checked
//! and resolved into a [`Manifest`], the subset this host runs.
//!
//! Supported: `[application]`, application `[variables]`, `[[trigger.http]]` with `route` (a
//! pattern, or `{ private = true }`) and a `component` reference, and `[component.<id>]` with
//! `source` (a local `.wasm` path, relative to the manifest's directory), `key_value_stores`,
//! `sqlite_databases`, `variables` (templates over application variables) and `environment`.
//! Fields Spin knows but this host has no use for (`build`, `tool`, `description`, …) are
//! accepted and ignored; fields Spin does not know are errors, as in Spin.
//!
//! Every error names the manifest and the offending key, on one line. Test suites and the
//! benchmark read `spin.toml` through [`Manifest::load`] too:
//!
//! ```no_run
//! let manifest = spin_host::manifest::Manifest::load("spin.toml".as_ref())?;
//! for trigger in &manifest.http_triggers {
//!     let component = &manifest.components[&trigger.component];
//!     println!("{:?} -> {} ({})", trigger.route, component.id, component.source.display());
//! }
//! # anyhow::Ok(())
//! ```

mod ids;
pub mod schema;
pub mod template;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use self::ids::{KEBAB, LOWER_SNAKE, check_label};
use self::schema::{AppManifest, ComponentSource, ComponentSpec, HttpRoute, HttpTriggerConfig};
use self::template::{Template, validate_name};

/// A parsed, validated `spin.toml`.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// Path of the manifest file.
    pub path: PathBuf,
    /// Directory of the manifest; relative paths in it are resolved here.
    pub dir: PathBuf,
    pub name: String,
    pub version: String,
    pub description: String,
    /// Application variables, by name.
    pub variables: BTreeMap<String, AppVariable>,
    /// HTTP triggers in manifest order.
    pub http_triggers: Vec<HttpTrigger>,
    /// Components by id.
    pub components: BTreeMap<String, ComponentConfig>,
    /// Things the manifest asks for that this host accepts but does not do.
    pub warnings: Vec<String>,
    /// The file as written.
    pub schema: AppManifest,
}

/// An application variable (`[variables]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppVariable {
    pub default: Option<String>,
    pub required: bool,
    pub secret: bool,
}

/// One `[[trigger.http]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpTrigger {
    /// `None` for `route = { private = true }`.
    pub route: Option<String>,
    pub component: String,
}

/// One `[component.<id>]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentConfig {
    pub id: String,
    /// `source` as written.
    pub source_raw: String,
    /// `source` resolved against the manifest directory.
    pub source: PathBuf,
    pub key_value_stores: Vec<String>,
    pub sqlite_databases: Vec<String>,
    /// Component variable templates, by name.
    pub variables: BTreeMap<String, Template>,
    pub environment: BTreeMap<String, String>,
    pub allowed_outbound_hosts: Vec<String>,
    /// The `build.command`, if any (several commands joined with ` && `).
    pub build_command: Option<String>,
}

/// An error in a manifest: which file, which key, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    pub path: PathBuf,
    /// Dotted key path, e.g. `component.meta.source`; empty for the file itself.
    pub key: String,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.path.display(), self.message)
        } else {
            write!(
                f,
                "{}: `{}`: {}",
                self.path.display(),
                self.key,
                self.message
            )
        }
    }
}

impl std::error::Error for ManifestError {}

impl Manifest {
    /// Reads and parses a manifest file.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError {
            path: path.to_path_buf(),
            key: String::new(),
            message: format!("cannot read the manifest: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Parses manifest text; `path` is used for the directory and in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ManifestError> {
        Checker { path }.parse(text)
    }

    /// The component ids that HTTP routes point at, in manifest order, deduplicated.
    pub fn routed_components(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = Vec::new();
        for t in &self.http_triggers {
            if !ids.contains(&t.component.as_str()) {
                ids.push(&t.component);
            }
        }
        ids
    }
}

/// Turns the schema into a [`Manifest`], with errors that name `path` and the key.
struct Checker<'a> {
    path: &'a Path,
}

type SerdeError = serde_path_to_error::Error<toml::de::Error>;

impl Checker<'_> {
    fn err(&self, key: impl Into<String>, message: impl Into<String>) -> ManifestError {
        ManifestError {
            path: self.path.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }

    /// A deserialization error at `prefix` + the path serde reached.
    fn schema_error(&self, prefix: &str, e: SerdeError) -> ManifestError {
        let reached = e.path().to_string();
        let mut key = match (prefix, reached.as_str()) {
            (prefix, ".") => prefix.to_string(),
            ("", reached) => reached.to_string(),
            (prefix, reached) if reached.starts_with('[') => format!("{prefix}{reached}"),
            (prefix, reached) => format!("{prefix}.{reached}"),
        };
        let message = e.inner().message().trim().replace('\n', " ");
        let quoted = |lead: &str| {
            message
                .strip_prefix(lead)
                .and_then(|rest| rest.split('`').next())
                .map(str::to_string)
        };
        let mut child = |field: &str| {
            if !(key == field || key.ends_with(&format!(".{field}"))) {
                key = if key.is_empty() {
                    field.to_string()
                } else {
                    format!("{key}.{field}")
                };
            }
        };
        if let Some(field) = quoted("missing field `") {
            child(&field);
            let message = if key == "trigger" {
                "missing: the app has no `[[trigger.http]]`"
            } else {
                "missing"
            };
            return self.err(key, message);
        }
        if let Some(field) = quoted("unknown field `") {
            child(&field);
            return self.err(key, "unknown key");
        }
        self.err(key, message)
    }

    fn parse(&self, text: &str) -> Result<Manifest, ManifestError> {
        let root: toml::Table = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .unwrap_or(0);
            let message = e.message().trim().replace('\n', " ");
            if line > 0 {
                self.err("", format!("invalid TOML at line {line}: {message}"))
            } else {
                self.err("", format!("invalid TOML: {message}"))
            }
        })?;
        // The version first: a version-1 manifest fails on its version, not on whichever of
        // its other keys version 2 does not know.
        let key = "spin_manifest_version";
        let version = root
            .get(key)
            .ok_or_else(|| self.err(key, "missing; must be 2"))?;
        schema::ManifestVersion::deserialize(version.clone())
            .map_err(|e| self.err(key, e.message().trim()))?;

        let schema: AppManifest = serde_path_to_error::deserialize(toml::Value::Table(root))
            .map_err(|e| self.schema_error("", e))?;

        let variables = self.app_variables(&schema)?;
        let mut warnings = Vec::new();
        let components = self.components(&schema, &variables, &mut warnings)?;
        let http_triggers = self.triggers(&schema, &components)?;

        let dir = self
            .path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    p.to_path_buf()
                }
            })
            .unwrap_or_else(|| PathBuf::from("."));
        let mut components = components;
        for component in components.values_mut() {
            component.source = dir.join(&component.source_raw);
        }
        Ok(Manifest {
            path: self.path.to_path_buf(),
            dir,
            name: schema.application.name.clone(),
            version: schema.application.version.clone(),
            description: schema.application.description.clone(),
            variables,
            http_triggers,
            components,
            warnings,
            schema,
        })
    }

    fn app_variables(
        &self,
        schema: &AppManifest,
    ) -> Result<BTreeMap<String, AppVariable>, ManifestError> {
        let mut out = BTreeMap::new();
        for (name, var) in &schema.variables {
            let key = format!("variables.{name}");
            LOWER_SNAKE
                .check(name)
                .and_then(|()| validate_name(name))
                .map_err(|e| self.err(&key, format!("invalid variable name: {e}")))?;
            if var.required && var.default.is_some() {
                return Err(self.err(
                    &key,
                    "a variable cannot be both `required` and have a `default`",
                ));
            }
            if !var.required && var.default.is_none() {
                return Err(self.err(
                    &key,
                    "a variable must have a `default` or be `required = true`",
                ));
            }
            out.insert(
                name.clone(),
                AppVariable {
                    default: var.default.clone(),
                    required: var.required,
                    secret: var.secret,
                },
            );
        }
        Ok(out)
    }

    fn components(
        &self,
        schema: &AppManifest,
        app_variables: &BTreeMap<String, AppVariable>,
        warnings: &mut Vec<String>,
    ) -> Result<BTreeMap<String, ComponentConfig>, ManifestError> {
        let mut out = BTreeMap::new();
        for (id, def) in &schema.components {
            let key = format!("component.{id}");
            KEBAB.check(id).map_err(|e| {
                self.err(
                    &key,
                    format!(
                        "component ids must be kebab-case, each word starting with a letter: {e}"
                    ),
                )
            })?;
            let source_raw = match &def.source {
                ComponentSource::Local(path) if !path.is_empty() => path.clone(),
                ComponentSource::Local(_) => {
                    return Err(self.err(format!("{key}.source"), "must be a path to a .wasm file"));
                }
                ComponentSource::Remote(_) => {
                    return Err(self.err(
                        format!("{key}.source"),
                        "only a local file path is supported as a source (no URL or registry sources)",
                    ));
                }
            };
            self.labels(&def.key_value_stores, &format!("{key}.key_value_stores"))?;
            self.labels(&def.sqlite_databases, &format!("{key}.sqlite_databases"))?;
            let mut variables = BTreeMap::new();
            for (name, text) in &def.variables {
                let vkey = format!("{key}.variables.{name}");
                LOWER_SNAKE
                    .check(name)
                    .and_then(|()| validate_name(name))
                    .map_err(|e| self.err(&vkey, format!("invalid variable name: {e}")))?;
                let template = Template::parse(text).map_err(|e| self.err(&vkey, e))?;
                for reference in template.references() {
                    if !app_variables.contains_key(reference) {
                        return Err(self.err(
                            &vkey,
                            format!(
                                "refers to `{reference}`, which is not declared in the application's [variables]"
                            ),
                        ));
                    }
                }
                variables.insert(name.clone(), template);
            }
            for (i, entry) in def.allowed_outbound_hosts.iter().enumerate() {
                let hkey = format!("{key}.allowed_outbound_hosts[{i}]");
                let template = Template::parse(entry).map_err(|e| self.err(&hkey, e))?;
                if let Some(unknown) = template
                    .references()
                    .find(|reference| !app_variables.contains_key(*reference))
                {
                    return Err(self.err(
                        &hkey,
                        format!(
                            "refers to `{unknown}`, which is not declared in the application's [variables]"
                        ),
                    ));
                }
            }
            if !def.files.is_empty() {
                warnings.push(format!(
                    "component `{id}`: `files` is not supported by this host; the component sees no files"
                ));
            }
            if !def.ai_models.is_empty() {
                warnings.push(format!(
                    "component `{id}`: `ai_models` is not supported by this host"
                ));
            }
            if !def.dependencies.is_empty() {
                return Err(self.err(
                    format!("{key}.dependencies"),
                    "component dependencies are not supported by this host",
                ));
            }
            out.insert(
                id.clone(),
                ComponentConfig {
                    id: id.clone(),
                    source: PathBuf::from(&source_raw),
                    source_raw,
                    key_value_stores: def.key_value_stores.clone(),
                    sqlite_databases: def.sqlite_databases.clone(),
                    variables,
                    environment: def.environment.clone(),
                    allowed_outbound_hosts: def.allowed_outbound_hosts.clone(),
                    build_command: def.build.as_ref().map(|b| b.command.as_one_line()),
                },
            );
        }
        Ok(out)
    }

    fn triggers(
        &self,
        schema: &AppManifest,
        components: &BTreeMap<String, ComponentConfig>,
    ) -> Result<Vec<HttpTrigger>, ManifestError> {
        if let Some(kind) = schema.triggers.keys().find(|kind| *kind != "http") {
            return Err(self.err(
                format!("trigger.{kind}"),
                "only HTTP triggers are supported by this host",
            ));
        }
        let mut out = Vec::new();
        for (i, trigger) in schema
            .triggers
            .get("http")
            .into_iter()
            .flatten()
            .enumerate()
        {
            let key = format!("trigger.http[{i}]");
            let config: HttpTriggerConfig =
                serde_path_to_error::deserialize(toml::Value::Table(trigger.config.clone()))
                    .map_err(|e| self.schema_error(&key, e))?;
            let route = match config.route {
                HttpRoute::Pattern(route) => Some(route),
                HttpRoute::Private(p) if p.private => None,
                HttpRoute::Private(_) => {
                    return Err(self.err(
                        format!("{key}.route"),
                        "must be a route pattern or `{ private = true }`",
                    ));
                }
            };
            let component = match &trigger.component {
                Some(ComponentSpec::Reference(id)) => id.clone(),
                Some(ComponentSpec::Inline(_)) => {
                    return Err(self.err(
                        format!("{key}.component"),
                        "inline components are not supported; declare it as [component.<id>] and refer to it by id",
                    ));
                }
                None => return Err(self.err(format!("{key}.component"), "missing")),
            };
            if !components.contains_key(&component) {
                let route_text = route.as_deref().unwrap_or("(private)");
                return Err(self.err(
                    format!("{key}.component"),
                    format!(
                        "route {route_text:?} points at component `{component}`, which is not defined (no [component.{component}])"
                    ),
                ));
            }
            if let Some(executor) = &config.executor
                && executor.kind != "spin"
                && executor.kind != "wasip2"
            {
                return Err(self.err(
                    format!("{key}.executor"),
                    "only the default executor (`{ type = \"spin\" }`, wasi:http 0.2) is supported",
                ));
            }
            out.push(HttpTrigger { route, component });
        }
        if out.is_empty() {
            return Err(self.err("trigger", "missing: the app has no `[[trigger.http]]`"));
        }
        Ok(out)
    }

    fn labels(&self, labels: &[String], key: &str) -> Result<(), ManifestError> {
        for label in labels {
            check_label(label).map_err(|e| self.err(key, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
spin_manifest_version = 2

[application]
name = "app"
version = "0.1.0"

[variables]
token = { required = true, secret = true }
region = { default = "eu", description = "where" }

[[trigger.http]]
route = "/hello"
component = "hello"

[[trigger.http]]
route = "/..."
component = "hello"

[[trigger.http]]
route = { private = true }
component = "internal"

[component.hello]
source = "target/hello.wasm"
key_value_stores = ["default"]
sqlite_databases = ["default"]
environment = { RUST_LOG = "info" }
[component.hello.variables]
token = "{{ token }}"
where = "in {{ region }}"
[component.hello.build]
command = "cargo build --target wasm32-wasip2 --release -p hello"
watch = ["src/**/*.rs"]

[component.internal]
source = "/abs/internal.wasm"
"#;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(Path::new("app/spin.toml"), text)
    }

    fn error(text: &str) -> ManifestError {
        parse(text).expect_err("manifest should be rejected")
    }

    #[test]
    fn parses_a_good_manifest() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.name, "app");
        assert_eq!(m.version, "0.1.0");
        assert_eq!(m.dir, PathBuf::from("app"));
        assert_eq!(
            m.variables["token"],
            AppVariable {
                default: None,
                required: true,
                secret: true
            }
        );
        assert_eq!(m.variables["region"].default.as_deref(), Some("eu"));
        assert_eq!(
            m.http_triggers,
            vec![
                HttpTrigger {
                    route: Some("/hello".into()),
                    component: "hello".into()
                },
                HttpTrigger {
                    route: Some("/...".into()),
                    component: "hello".into()
                },
                HttpTrigger {
                    route: None,
                    component: "internal".into()
                },
            ]
        );
        let hello = &m.components["hello"];
        assert_eq!(hello.source, PathBuf::from("app/target/hello.wasm"));
        assert_eq!(hello.key_value_stores, vec!["default"]);
        assert_eq!(hello.sqlite_databases, vec!["default"]);
        assert_eq!(hello.environment["RUST_LOG"], "info");
        assert_eq!(hello.variables.len(), 2);
        assert_eq!(
            hello.build_command.as_deref(),
            Some("cargo build --target wasm32-wasip2 --release -p hello")
        );
        assert_eq!(
            m.components["internal"].source,
            PathBuf::from("/abs/internal.wasm")
        );
        assert!(m.components["internal"].key_value_stores.is_empty());
        assert_eq!(m.routed_components(), vec!["hello", "internal"]);
        assert!(m.warnings.is_empty());
    }

    #[test]
    fn manifest_in_current_directory_resolves_against_dot() {
        let m = Manifest::parse(Path::new("spin.toml"), GOOD).unwrap();
        assert_eq!(
            m.components["hello"].source,
            PathBuf::from("./target/hello.wasm")
        );
    }

    #[test]
    fn parses_the_project_manifest() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../spin.toml");
        let m = Manifest::load(&path).unwrap();
        assert!(!m.http_triggers.is_empty());
        for t in &m.http_triggers {
            assert!(m.components.contains_key(&t.component));
        }
    }

    #[test]
    fn parses_the_probe_manifest() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/probe/spin.toml");
        let m = Manifest::load(&path).unwrap();
        assert!(m.components["probe-nostores"].key_value_stores.is_empty());
        assert!(m.variables["api_token"].required);
    }

    #[test]
    fn invalid_toml_names_the_line() {
        let e = error("spin_manifest_version = 2\n[application\nname = 'x'\n");
        assert!(e.message.contains("invalid TOML at line 2"), "{e}");
        assert!(!e.to_string().contains('\n'), "one line: {e}");
    }

    #[test]
    fn wrong_or_missing_version() {
        let e = error("spin_manifest_version = \"1\"\n");
        assert_eq!(e.key, "spin_manifest_version");
        let e = error("spin_manifest_version = 3\n");
        assert_eq!(e.key, "spin_manifest_version");
        let e = error("[application]\nname = \"x\"\n");
        assert_eq!(e.key, "spin_manifest_version");
    }

    #[test]
    fn missing_application_or_name() {
        assert_eq!(error("spin_manifest_version = 2\n").key, "application");
        assert_eq!(
            error("spin_manifest_version = 2\n[application]\nversion = \"1\"\n").key,
            "application.name"
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = error(&GOOD.replace(
            "key_value_stores = [\"default\"]",
            "key_value_store = [\"default\"]",
        ));
        assert_eq!(e.key, "component.hello.key_value_store");
        assert!(e.to_string().contains("unknown key"));
        let e = error(&format!("{GOOD}\nfoo = 1\n").replace(
            "spin_manifest_version = 2",
            "spin_manifest_version = 2\nbar = 1",
        ));
        assert_eq!(e.key, "bar");
    }

    #[test]
    fn route_to_unknown_component() {
        let e = error(&GOOD.replace("component = \"internal\"", "component = \"nope\""));
        assert_eq!(e.key, "trigger.http[2].component");
        assert!(e.message.contains("`nope`"), "{e}");
        assert!(e.message.contains("not defined"), "{e}");
    }

    #[test]
    fn missing_source() {
        let e = error(&GOOD.replace("source = \"/abs/internal.wasm\"", ""));
        assert_eq!(e.key, "component.internal.source");
        assert_eq!(e.message, "missing");
    }

    #[test]
    fn missing_route() {
        let e = error(&GOOD.replace("route = \"/hello\"\n", ""));
        assert_eq!(e.key, "trigger.http[0].route");
    }

    #[test]
    fn bad_types() {
        let e = error(&GOOD.replace("route = \"/hello\"", "route = 5"));
        assert_eq!(e.key, "trigger.http[0].route");
        let e = error(&GOOD.replace(
            "sqlite_databases = [\"default\"]",
            "sqlite_databases = \"default\"",
        ));
        assert_eq!(e.key, "component.hello.sqlite_databases");
        let e = error(&GOOD.replace("token = \"{{ token }}\"", "token = 1"));
        assert_eq!(e.key, "component.hello.variables.token");
    }

    #[test]
    fn variable_errors() {
        let e = error(&GOOD.replace(
            "where = \"in {{ region }}\"",
            "where = \"in {{ nowhere }}\"",
        ));
        assert_eq!(e.key, "component.hello.variables.where");
        assert!(e.message.contains("nowhere"), "{e}");
        let e = error(&GOOD.replace("where = \"in {{ region }}\"", "where = \"in {{ region \""));
        assert_eq!(e.key, "component.hello.variables.where");
        let e = error(&GOOD.replace(
            "region = { default = \"eu\", description = \"where\" }",
            "Region = { default = \"eu\" }",
        ));
        assert_eq!(e.key, "variables.Region");
        let e = error(&GOOD.replace(
            "token = { required = true, secret = true }",
            "token = { required = true, default = \"x\" }",
        ));
        assert_eq!(e.key, "variables.token");
        let e = error(&GOOD.replace(
            "token = { required = true, secret = true }",
            "token = { secret = true }",
        ));
        assert_eq!(e.key, "variables.token");
        let e = error(&GOOD.replace(
            "token = { required = true, secret = true }",
            "token = { required = true, secrett = true }",
        ));
        assert_eq!(e.key, "variables.token.secrett");
    }

    #[test]
    fn bad_component_id_and_labels() {
        let e = error(&GOOD.replace("[component.internal]", "[component.Internal]"));
        assert_eq!(e.key, "component.Internal");
        let e = error(&GOOD.replace(
            "key_value_stores = [\"default\"]",
            "key_value_stores = [\"b@d\"]",
        ));
        assert_eq!(e.key, "component.hello.key_value_stores");
        // Spin 4.1 refuses a label any of whose words starts with a digit.
        let e = error(&GOOD.replace(
            "sqlite_databases = [\"default\"]",
            "sqlite_databases = [\"default\", \"cell-1\"]",
        ));
        assert_eq!(e.key, "component.hello.sqlite_databases");
        assert!(e.to_string().contains("\"cell-1\""), "{e}");
        let m = parse(&GOOD.replace(
            "sqlite_databases = [\"default\"]",
            "sqlite_databases = [\"default\", \"cell1\"]",
        ))
        .unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    #[test]
    fn unsupported_features() {
        let e = error(&GOOD.replace(
            "[[trigger.http]]\nroute = \"/hello\"",
            "[[trigger.redis]]\nchannel = \"x\"\n[[trigger.http]]\nroute = \"/hello\"",
        ));
        assert_eq!(e.key, "trigger.redis");
        let e = error(&GOOD.replace(
            "component = \"internal\"",
            "component = { source = \"x.wasm\" }",
        ));
        assert_eq!(e.key, "trigger.http[2].component");
        let e = error(&GOOD.replace(
            "source = \"/abs/internal.wasm\"",
            "source = { url = \"https://x\", digest = \"y\" }",
        ));
        assert_eq!(e.key, "component.internal.source");
        let m = parse(&GOOD.replace(
            "source = \"/abs/internal.wasm\"",
            "source = \"/abs/internal.wasm\"\nallowed_outbound_hosts = [\"https://example.com\"]\nfiles = [\"assets/*\"]",
        ))
        .unwrap();
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
    }

    #[test]
    fn allowed_outbound_hosts_may_be_templates_over_declared_variables_only() {
        let with_hosts = |hosts: &str| {
            GOOD.replace(
                "source = \"/abs/internal.wasm\"",
                &format!("source = \"/abs/internal.wasm\"\nallowed_outbound_hosts = {hosts}"),
            )
        };
        let m = parse(&with_hosts(r#"["http://{{ region }}.internal:3000"]"#)).unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        let e = error(&with_hosts(r#"["http://x", "{{ home }}"]"#));
        assert_eq!(e.key, "component.internal.allowed_outbound_hosts[1]");
        assert!(e.to_string().contains("`home`"), "{e}");
        let e = error(&with_hosts(r#"["{{ region"]"#));
        assert_eq!(e.key, "component.internal.allowed_outbound_hosts[0]");
    }

    #[test]
    fn no_triggers() {
        let e = error("spin_manifest_version = 2\n[application]\nname = \"x\"\n");
        assert_eq!(e.key, "trigger");
    }

    #[test]
    fn error_display_is_one_line_with_path_and_key() {
        let e = error(&GOOD.replace("source = \"/abs/internal.wasm\"", ""));
        assert_eq!(
            e.to_string(),
            "app/spin.toml: `component.internal.source`: missing"
        );
    }
}
