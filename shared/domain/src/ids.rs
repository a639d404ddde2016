//! Identifiers chosen by callers (orgs, nodes, units, VMs) and generated ones.

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
        }
    }
}
