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

/// Checks a variable name the way Spin does: lower-case ASCII letters, digits
/// and single underscores, starting with a letter and ending with a letter or
/// digit. The error text is Spin's.
pub fn validate_name(name: &str) -> Result<(), String> {
    let reason = if name.is_empty() {
        Some("must not be empty".to_string())
    } else if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        Some(format!(
            "invalid character {c:?}. Variable names may contain only lower-case letters, numbers, and underscores."
        ))
    } else if !name.as_bytes()[0].is_ascii_lowercase() {
        Some("must start with a lowercase ASCII letter".to_string())
    } else if !name.as_bytes()[name.len() - 1].is_ascii_alphanumeric() {
        Some("must end with a lowercase ASCII letter or digit".to_string())
    } else if name.contains("__") {
        Some("must not contain multiple consecutive underscores".to_string())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(format!("{name:?}: {reason}")),
        None => Ok(()),
    }
}

/// The environment variable that provides an application variable's value.
pub fn env_var_name(variable: &str) -> String {
    format!("SPIN_VARIABLE_{}", variable.to_ascii_uppercase())
}

/// A component variable's value: literal text and `{{ variable }}` references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Reference(String),
}

impl Template {
    /// Parses `"text {{ name }} more"`; whitespace inside braces is ignored.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{{") {
                let Some((expr, tail)) = after.split_once("}}") else {
                    return Err("unmatched '{{' in template".to_string());
                };
                parts.push(Part::Reference(expr.trim().to_string()));
                rest = tail;
            } else {
                let end = rest.find("{{").unwrap_or(rest.len());
                parts.push(Part::Literal(rest[..end].to_string()));
                rest = &rest[end..];
            }
        }
        Ok(Self { parts })
    }

    /// Names of the application variables the template uses.
    pub fn references(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Reference(name) => Some(name.as_str()),
            Part::Literal(_) => None,
        })
    }

    fn render(&self, values: &HashMap<String, String>) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Reference(name) => out.push_str(values.get(name)?),
            }
        }
        Some(out)
    }
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
    async fn get(&mut self, name: String) -> wasmtime::Result<Result<String, Error>> {
        Ok(self.resolver.get(&self.component, &name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn names() {
        for good in ["a", "abc", "a1b2c3", "a_1", "a_1_b_3", "operator_token"] {
            validate_name(good).expect(good);
        }
        for bad in ["", "aX", "1bc", "_x", "x.y", "x_", "a__b", "x-y", "Token"] {
            validate_name(bad).expect_err(bad);
        }
    }

    #[test]
    fn templates() {
        let t = Template::parse("a-{{ x }}-{{y}}").unwrap();
        assert_eq!(t.references().collect::<Vec<_>>(), vec!["x", "y"]);
        let values = HashMap::from([
            ("x".to_string(), "1".to_string()),
            ("y".to_string(), "2".to_string()),
        ]);
        assert_eq!(t.render(&values).as_deref(), Some("a-1-2"));
        assert_eq!(
            Template::parse("").unwrap().render(&values).as_deref(),
            Some("")
        );
        assert_eq!(
            Template::parse("plain").unwrap().render(&values).as_deref(),
            Some("plain")
        );
        Template::parse("{{ ok }} {{ unmatched").unwrap_err();
    }

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
