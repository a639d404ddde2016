//! Parsing of `spin.toml` (manifest version 2), the subset this host runs.
//!
//! Supported: `[application]`, application `[variables]` (`default`,
//! `required`, `secret`, `description`), `[[trigger.http]]` with `route` (a
//! pattern, or `{ private = true }`) and a `component` reference, and
//! `[component.<id>]` with `source` (a local `.wasm` path, relative to the
//! manifest's directory), `key_value_stores`, `sqlite_databases`, `variables`
//! (templates over application variables) and `environment`. Keys Spin knows
//! but this host has no use for (`build`, `tool`, `description`, …) are
//! accepted and ignored; keys Spin does not know are errors, as in Spin, so a
//! typo such as `key_value_store` cannot silently take a store away.
//!
//! Every error names the manifest and the offending key, on one line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::variables::{Template, validate_name};

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
    /// The `build.command`, if any (used in error messages).
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

type Table = toml::map::Map<String, toml::Value>;

const COMPONENT_IGNORED_KEYS: &[&str] = &[
    "description",
    "build",
    "tool",
    "allowed_http_hosts",
    "exclude_files",
    "dependencies_inherit_configuration",
    "profile",
];

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
        Parser { path }.parse(text)
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

struct Parser<'a> {
    path: &'a Path,
}

impl Parser<'_> {
    fn err(&self, key: impl Into<String>, message: impl Into<String>) -> ManifestError {
        ManifestError {
            path: self.path.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }

    fn parse(&self, text: &str) -> Result<Manifest, ManifestError> {
        let root: Table = toml::from_str(text).map_err(|e| {
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

        for key in root.keys() {
            if ![
                "spin_manifest_version",
                "application",
                "variables",
                "trigger",
                "component",
            ]
            .contains(&key.as_str())
            {
                return Err(self.err(key.clone(), "unknown key"));
            }
        }

        match root.get("spin_manifest_version") {
            Some(toml::Value::Integer(2)) => {}
            Some(toml::Value::String(v)) if v == "1" => {
                return Err(self.err(
                    "spin_manifest_version",
                    "manifest version 1 is not supported; use `spin_manifest_version = 2`",
                ));
            }
            Some(other) => {
                return Err(self.err("spin_manifest_version", format!("must be 2, found {other}")));
            }
            None => return Err(self.err("spin_manifest_version", "missing; must be 2")),
        }

        let application = self
            .table(&root, "application", "application")?
            .ok_or_else(|| self.err("application", "missing `[application]` table"))?;
        for key in application.keys() {
            if ![
                "name",
                "version",
                "description",
                "authors",
                "targets",
                "trigger",
                "tool",
            ]
            .contains(&key.as_str())
            {
                return Err(self.err(format!("application.{key}"), "unknown key"));
            }
        }
        let name = self
            .string(application, "name", "application.name")?
            .ok_or_else(|| self.err("application.name", "missing"))?;
        let version = self
            .string(application, "version", "application.version")?
            .unwrap_or_default();
        let description = self
            .string(application, "description", "application.description")?
            .unwrap_or_default();

        let variables = self.app_variables(&root)?;
        let mut warnings = Vec::new();
        let components = self.components(&root, &variables, &mut warnings)?;
        let http_triggers = self.triggers(&root, &components)?;

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
        let mut manifest = Manifest {
            path: self.path.to_path_buf(),
            dir,
            name,
            version,
            description,
            variables,
            http_triggers,
            components,
            warnings,
        };
        let dir = manifest.dir.clone();
        for component in manifest.components.values_mut() {
            component.source = dir.join(&component.source_raw);
        }
        Ok(manifest)
    }

    fn app_variables(&self, root: &Table) -> Result<BTreeMap<String, AppVariable>, ManifestError> {
        let mut out = BTreeMap::new();
        let Some(vars) = self.table(root, "variables", "variables")? else {
            return Ok(out);
        };
        for (name, value) in vars {
            let key = format!("variables.{name}");
            validate_name(name)
                .map_err(|e| self.err(&key, format!("invalid variable name: {e}")))?;
            let toml::Value::Table(def) = value else {
                return Err(self.err(
                    &key,
                    "must be a table such as `{ default = \"...\" }` or `{ required = true }`",
                ));
            };
            for field in def.keys() {
                if !["default", "required", "secret", "description"].contains(&field.as_str()) {
                    return Err(self.err(format!("{key}.{field}"), "unknown key"));
                }
            }
            let default = self.string(def, "default", &format!("{key}.default"))?;
            let required = self
                .bool(def, "required", &format!("{key}.required"))?
                .unwrap_or(false);
            let secret = self
                .bool(def, "secret", &format!("{key}.secret"))?
                .unwrap_or(false);
            self.string(def, "description", &format!("{key}.description"))?;
            if required && default.is_some() {
                return Err(self.err(
                    &key,
                    "a variable cannot be both `required` and have a `default`",
                ));
            }
            if !required && default.is_none() {
                return Err(self.err(
                    &key,
                    "a variable must have a `default` or be `required = true`",
                ));
            }
            out.insert(
                name.clone(),
                AppVariable {
                    default,
                    required,
                    secret,
                },
            );
        }
        Ok(out)
    }

    fn components(
        &self,
        root: &Table,
        app_variables: &BTreeMap<String, AppVariable>,
        warnings: &mut Vec<String>,
    ) -> Result<BTreeMap<String, ComponentConfig>, ManifestError> {
        let mut out = BTreeMap::new();
        let Some(components) = self.table(root, "component", "component")? else {
            return Ok(out);
        };
        for (id, value) in components {
            let key = format!("component.{id}");
            if !is_kebab_id(id) {
                return Err(self.err(
                    &key,
                    "component ids must be kebab-case: lower-case letters, digits and single hyphens, starting with a letter",
                ));
            }
            let toml::Value::Table(def) = value else {
                return Err(self.err(&key, "must be a table"));
            };
            for field in def.keys() {
                let known = [
                    "source",
                    "key_value_stores",
                    "sqlite_databases",
                    "variables",
                    "environment",
                    "allowed_outbound_hosts",
                    "files",
                    "ai_models",
                    "dependencies",
                ];
                if !known.contains(&field.as_str())
                    && !COMPONENT_IGNORED_KEYS.contains(&field.as_str())
                {
                    return Err(self.err(format!("{key}.{field}"), "unknown key"));
                }
            }
            let source_raw = match def.get("source") {
                Some(toml::Value::String(s)) if !s.is_empty() => s.clone(),
                Some(toml::Value::Table(_)) => {
                    return Err(self.err(
                        format!("{key}.source"),
                        "only a local file path is supported as a source (no URL or registry sources)",
                    ));
                }
                Some(_) => {
                    return Err(self.err(format!("{key}.source"), "must be a path to a .wasm file"));
                }
                None => return Err(self.err(format!("{key}.source"), "missing")),
            };
            let key_value_stores = self.labels(def, "key_value_stores", &key)?;
            let sqlite_databases = self.labels(def, "sqlite_databases", &key)?;
            let mut variables = BTreeMap::new();
            if let Some(vars) = self.table(def, "variables", &format!("{key}.variables"))? {
                for (name, value) in vars {
                    let vkey = format!("{key}.variables.{name}");
                    validate_name(name)
                        .map_err(|e| self.err(&vkey, format!("invalid variable name: {e}")))?;
                    let toml::Value::String(text) = value else {
                        return Err(self.err(
                            &vkey,
                            "must be a string (a template such as \"{{ name }}\")",
                        ));
                    };
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
            }
            let mut environment = BTreeMap::new();
            if let Some(env) = self.table(def, "environment", &format!("{key}.environment"))? {
                for (name, value) in env {
                    let toml::Value::String(v) = value else {
                        return Err(
                            self.err(format!("{key}.environment.{name}"), "must be a string")
                        );
                    };
                    environment.insert(name.clone(), v.clone());
                }
            }
            let allowed_outbound_hosts = self
                .string_list(
                    def,
                    "allowed_outbound_hosts",
                    &format!("{key}.allowed_outbound_hosts"),
                )?
                .unwrap_or_default();
            if !allowed_outbound_hosts.is_empty() {
                warnings.push(format!(
                    "component `{id}`: allowed_outbound_hosts is ignored; this host denies all outbound HTTP and network access"
                ));
            }
            if def
                .get("files")
                .is_some_and(|f| !matches!(f, toml::Value::Array(a) if a.is_empty()))
            {
                warnings.push(format!(
                    "component `{id}`: `files` is not supported by this host; the component sees no files"
                ));
            }
            if def
                .get("ai_models")
                .is_some_and(|f| !matches!(f, toml::Value::Array(a) if a.is_empty()))
            {
                warnings.push(format!(
                    "component `{id}`: `ai_models` is not supported by this host"
                ));
            }
            if def
                .get("dependencies")
                .is_some_and(|f| !matches!(f, toml::Value::Table(t) if t.is_empty()))
            {
                return Err(self.err(
                    format!("{key}.dependencies"),
                    "component dependencies are not supported by this host",
                ));
            }
            let build_command = def
                .get("build")
                .and_then(|b| b.get("command"))
                .and_then(|c| c.as_str())
                .map(str::to_string);
            out.insert(
                id.clone(),
                ComponentConfig {
                    id: id.clone(),
                    source: PathBuf::from(&source_raw),
                    source_raw,
                    key_value_stores,
                    sqlite_databases,
                    variables,
                    environment,
                    allowed_outbound_hosts,
                    build_command,
                },
            );
        }
        Ok(out)
    }

    fn triggers(
        &self,
        root: &Table,
        components: &BTreeMap<String, ComponentConfig>,
    ) -> Result<Vec<HttpTrigger>, ManifestError> {
        let Some(triggers) = self.table(root, "trigger", "trigger")? else {
            return Err(self.err("trigger", "missing: the app has no `[[trigger.http]]`"));
        };
        let mut out = Vec::new();
        for (kind, list) in triggers {
            if kind != "http" {
                return Err(self.err(
                    format!("trigger.{kind}"),
                    "only HTTP triggers are supported by this host",
                ));
            }
            let toml::Value::Array(list) = list else {
                return Err(self.err(
                    "trigger.http",
                    "must be an array of tables (`[[trigger.http]]`)",
                ));
            };
            for (i, t) in list.iter().enumerate() {
                let key = format!("trigger.http[{i}]");
                let toml::Value::Table(t) = t else {
                    return Err(self.err(&key, "must be a table"));
                };
                for field in t.keys() {
                    if !["route", "component", "executor", "id"].contains(&field.as_str()) {
                        return Err(self.err(format!("{key}.{field}"), "unknown key"));
                    }
                }
                let route = match t.get("route") {
                    Some(toml::Value::String(r)) => Some(r.clone()),
                    Some(toml::Value::Table(p)) => match p.get("private") {
                        Some(toml::Value::Boolean(true)) if p.len() == 1 => None,
                        _ => {
                            return Err(self.err(
                                format!("{key}.route"),
                                "must be a route pattern or `{ private = true }`",
                            ));
                        }
                    },
                    Some(_) => {
                        return Err(self.err(
                            format!("{key}.route"),
                            "must be a string such as \"/api/...\"",
                        ));
                    }
                    None => return Err(self.err(format!("{key}.route"), "missing")),
                };
                let component = match t.get("component") {
                    Some(toml::Value::String(c)) => c.clone(),
                    Some(toml::Value::Table(_)) => {
                        return Err(self.err(
                            format!("{key}.component"),
                            "inline components are not supported; declare it as [component.<id>] and refer to it by id",
                        ));
                    }
                    Some(_) => {
                        return Err(self.err(format!("{key}.component"), "must be a component id"));
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
                if let Some(executor) = t.get("executor") {
                    let kind = executor.get("type").and_then(|v| v.as_str());
                    if kind != Some("spin") && kind != Some("wasip2") {
                        return Err(self.err(
                            format!("{key}.executor"),
                            "only the default executor (`{ type = \"spin\" }`, wasi:http 0.2) is supported",
                        ));
                    }
                }
                out.push(HttpTrigger { route, component });
            }
        }
        Ok(out)
    }

    fn table<'t>(
        &self,
        t: &'t Table,
        name: &str,
        key: &str,
    ) -> Result<Option<&'t Table>, ManifestError> {
        match t.get(name) {
            None => Ok(None),
            Some(toml::Value::Table(inner)) => Ok(Some(inner)),
            Some(_) => Err(self.err(key, "must be a table")),
        }
    }

    fn string(&self, t: &Table, name: &str, key: &str) -> Result<Option<String>, ManifestError> {
        match t.get(name) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(key, "must be a string")),
        }
    }

    fn bool(&self, t: &Table, name: &str, key: &str) -> Result<Option<bool>, ManifestError> {
        match t.get(name) {
            None => Ok(None),
            Some(toml::Value::Boolean(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(key, "must be true or false")),
        }
    }

    fn string_list(
        &self,
        t: &Table,
        name: &str,
        key: &str,
    ) -> Result<Option<Vec<String>>, ManifestError> {
        match t.get(name) {
            None => Ok(None),
            Some(toml::Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => Ok(s.clone()),
                    _ => Err(self.err(key, "must be a list of strings")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(self.err(key, "must be a list of strings")),
        }
    }

    fn labels(
        &self,
        def: &Table,
        name: &str,
        component_key: &str,
    ) -> Result<Vec<String>, ManifestError> {
        let key = format!("{component_key}.{name}");
        let labels = self.string_list(def, name, &key)?.unwrap_or_default();
        for label in &labels {
            if !is_label(label) {
                return Err(self.err(
                    &key,
                    format!("label {label:?} must be kebab-case or snake_case"),
                ));
            }
        }
        Ok(labels)
    }
}

fn is_kebab_id(id: &str) -> bool {
    id.split('-').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    }) && id.starts_with(|c: char| c.is_ascii_lowercase())
}

fn is_label(label: &str) -> bool {
    let ok = |sep: char| {
        label.split(sep).all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
    };
    label.starts_with(|c: char| c.is_ascii_lowercase()) && (ok('-') || ok('_'))
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
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spin.toml");
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
        assert_eq!(m.warnings.len(), 2, "{:?}", m.warnings);
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
