//! `fermyon:spin/variables@2.0.0`: application and component variables.
//!
//! As in Spin, a component sees only the variables declared in its own
//! `[component.<id>.variables]` table. Each one is a template over the
//! application variables (`"{{ name }}"`, `"prefix-{{ a }}-{{ b }}"`). An
//! application variable takes its value from the environment variable
//! `SPIN_VARIABLE_<NAME>` (upper-cased), else from its `default`. A `required`
//! variable with no value stops the host from starting.
//!
//! All application variables are resolved once, when the host starts, so a
//! guest's `get` only renders a template.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use wasmtime::component::HasData;

use crate::bindings::fermyon::spin::variables::{self as wit, Error};
use crate::manifest::Manifest;
use crate::manifest::template::{Template, validate_name};

/// The environment variable that provides an application variable's value.
pub fn env_var_name(variable: &str) -> String {
    format!("SPIN_VARIABLE_{}", variable.to_ascii_uppercase())
}

/// Resolved application variables plus every component's templates.
#[derive(Debug, Default)]
pub struct Resolver {
    values: HashMap<String, String>,
    components: HashMap<String, BTreeMap<String, Template>>,
}

impl Resolver {
    /// Resolves the application variables; `lookup` reads an environment
    /// variable. Fails, naming the variable, if a required one has no value.
    pub fn new(
        manifest: &Manifest,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let mut values = HashMap::new();
        let mut missing = Vec::new();
        for (name, var) in &manifest.variables {
            match lookup(&env_var_name(name)).or_else(|| var.default.clone()) {
                Some(value) => {
                    values.insert(name.clone(), value);
                }
                None => missing.push(name.as_str()),
            }
        }
        if !missing.is_empty() {
            let list = missing
                .iter()
                .map(|n| format!("`{n}` (set {})", env_var_name(n)))
                .collect::<Vec<_>>()
                .join(", ");
            anyhow::bail!(
                "required application variable{} {list} {} no value",
                if missing.len() == 1 { "" } else { "s" },
                if missing.len() == 1 { "has" } else { "have" },
            );
        }
        let components = manifest
            .components
            .iter()
            .map(|(id, c)| (id.clone(), c.variables.clone()))
            .collect();
        Ok(Self { values, components })
    }

    /// `template` rendered with the application variables' values; `None` if it refers to
    /// one that does not exist.
    pub(crate) fn render(&self, template: &Template) -> Option<String> {
        template.render(&self.values)
    }

    /// What `variables.get(name)` returns to `component`.
    pub fn get(&self, component: &str, name: &str) -> Result<String, Error> {
        validate_name(name).map_err(Error::InvalidName)?;
        let template = self
            .components
            .get(component)
            .and_then(|vars| vars.get(name))
            .ok_or_else(|| Error::Undefined(format!("no variable for {component:?}.{name:?}")))?;
        template.render(&self.values).ok_or_else(|| {
            Error::Other(format!(
                "variable {name:?} refers to an unknown application variable"
            ))
        })
    }
}

/// Per-instance state of the variables interface.
pub struct VariablesState {
    pub(crate) component: Arc<str>,
    pub(crate) resolver: Arc<Resolver>,
}

/// [`HasData`] marker for linking the variables interface.
pub struct Variables;

impl HasData for Variables {
    type Data<'a> = &'a mut VariablesState;
}

impl wit::Host for VariablesState {
    #[tracing::instrument(name = "spin_variables.get", skip(self), fields(otel.kind = "client"))]
    async fn get(&mut self, name: String) -> wasmtime::Result<Result<String, Error>> {
        Ok(self.resolver.get(&self.component, &name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MANIFEST: &str = r#"
spin_manifest_version = 2
[application]
name = "vars"
[variables]
token = { required = true }
region = { default = "eu" }
[[trigger.http]]
route = "/..."
component = "c"
[component.c]
source = "c.wasm"
[component.c.variables]
token = "{{ token }}"
where = "in {{ region }}"
"#;

    #[test]
    fn resolves_from_env_then_default() {
        let m = Manifest::parse(Path::new("spin.toml"), MANIFEST).unwrap();
        let r = Resolver::new(&m, |k| {
            (k == "SPIN_VARIABLE_TOKEN").then(|| "s3cret".to_string())
        })
        .unwrap();
        assert_eq!(r.get("c", "token").unwrap(), "s3cret");
        assert_eq!(r.get("c", "where").unwrap(), "in eu");
        let r = Resolver::new(&m, |k| match k {
            "SPIN_VARIABLE_TOKEN" => Some("t".to_string()),
            "SPIN_VARIABLE_REGION" => Some("us".to_string()),
            _ => None,
        })
        .unwrap();
        assert_eq!(r.get("c", "where").unwrap(), "in us");
    }

    #[test]
    fn undeclared_and_invalid_names() {
        let m = Manifest::parse(Path::new("spin.toml"), MANIFEST).unwrap();
        let r = Resolver::new(&m, |_| Some("x".to_string())).unwrap();
        // `region` is an application variable, but the component does not declare it.
        assert!(matches!(r.get("c", "region"), Err(Error::Undefined(_))));
        assert!(matches!(r.get("other", "token"), Err(Error::Undefined(_))));
        assert!(matches!(r.get("c", "Token"), Err(Error::InvalidName(_))));
    }

    #[test]
    fn required_variable_missing_names_it() {
        let m = Manifest::parse(Path::new("spin.toml"), MANIFEST).unwrap();
        let e = Resolver::new(&m, |_| None).unwrap_err().to_string();
        assert!(e.contains("`token`"), "{e}");
        assert!(e.contains("SPIN_VARIABLE_TOKEN"), "{e}");
    }
}
