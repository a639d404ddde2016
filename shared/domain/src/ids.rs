//! Identifiers chosen by callers (orgs, nodes, units, VMs) and generated ones.

use std::fmt;
use std::marker::PhantomData;

use crate::error::DomainError;

/// The longest id accepted.
pub const MAX_ID_LEN: usize = 128;

/// An id is 1–128 characters of ASCII letters, digits and `.`, `_`, `:`, `-`, starting with
/// a letter or digit: safe in a URL path segment, in a log line and in a key-value key.
pub fn is_valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    id.len() <= MAX_ID_LEN
        && first.is_ascii_alphanumeric()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// Checks every id of a list, naming the field and the first offending id.
pub fn validate_ids<'a>(
    field: &'static str,
    ids: impl IntoIterator<Item = &'a String>,
) -> Result<(), DomainError> {
    match ids.into_iter().find(|id| !is_valid_id(id)) {
        None => Ok(()),
        Some(bad) => Err(DomainError::invalid(
            field,
            format!(
                "{:?} is not a valid id (1-{MAX_ID_LEN} characters: letters, digits, '.', '_', ':', '-', starting with a letter or digit)",
                truncate(bad)
            ),
        )),
    }
}

/// What an id names; its name is what a refusal says was not found.
pub trait Kind {
    const NAME: &'static str;
}

macro_rules! kinds {
    ($($(#[$doc:meta])* $kind:ident = $name:literal;)+) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $kind {}
        impl Kind for $kind {
            const NAME: &'static str = $name;
        }
    )+};
}

kinds! {
    /// A GPU node.
    Node = "node";
    /// A reservation on a node.
    Reservation = "reservation";
    /// A VM on units of a node.
    Vm = "VM";
    /// An org.
    Org = "org";
    /// An org's API key.
    ApiKey = "API key";
    /// A platform operator's key.
    OperatorKey = "operator key";
}

/// The id of a `T` ([`Node`], [`Reservation`], …) that has passed [`is_valid_id`]: a value
/// of this type is safe in a URL path segment, a log line and a key-value key.
pub struct Id<T> {
    value: String,
    kind: PhantomData<fn() -> T>,
}

impl<T: Kind> Id<T> {
    /// The id, if `value` is a valid one.
    pub fn parse(value: &str) -> Option<Id<T>> {
        is_valid_id(value).then(|| Id {
            value: value.to_owned(),
            kind: PhantomData,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.value
    }
}

impl<T> Clone for Id<T> {
    fn clone(&self) -> Self {
        Id {
            value: self.value.clone(),
            kind: PhantomData,
        }
    }
}

impl<T> PartialEq for Id<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T> Eq for Id<T> {}

impl<T> fmt::Debug for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.value, f)
    }
}

impl<T> fmt::Display for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.value)
    }
}

impl<T> std::ops::Deref for Id<T> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.value
    }
}

fn truncate(id: &str) -> &str {
    let end = id
        .char_indices()
        .map(|(i, _)| i)
        .nth(40)
        .unwrap_or(id.len());
    &id[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_path_and_key_safe() {
        for good in ["n1", "gpu-0", "org_a", "a.b:c-d", &"x".repeat(MAX_ID_LEN)] {
            assert!(is_valid_id(good), "{good}");
        }
        for bad in [
            "",
            "-x",
            ".",
            "..",
            "a/b",
            "../etc",
            "a b",
            "é",
            "a;drop",
            "a'",
            &"x".repeat(MAX_ID_LEN + 1),
        ] {
            assert!(!is_valid_id(bad), "{bad}");
            assert_eq!(Id::<Node>::parse(bad), None);
        }
        assert_eq!(
            Id::<Node>::parse("n1").map(|id| id.to_string()),
            Some("n1".into())
        );
    }
}
