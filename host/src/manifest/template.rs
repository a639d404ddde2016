//! The variable names and templates of `spin.toml`: `[variables]` names, and the
//! `{{ name }}` templates of `[component.<id>.variables]`.

use std::collections::HashMap;

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

    pub(crate) fn render(&self, values: &HashMap<String, String>) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
