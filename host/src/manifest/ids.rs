//! The identifiers of `spin.toml` as Spin 4.1's manifest reads them (`spin_serde`'s `Id`):
//! component ids are kebab-case, database and key-value store labels kebab-case or
//! snake_case, variable names lower snake_case.
//!
//! An id is one or more words joined by its separator; every word is non-empty, starts with
//! an ASCII letter and goes on with ASCII letters and digits, all of one case. So `cell1`
//! and `cell-one` are labels and `cell-1` is not: its second word starts with a digit.

/// How the words of an id are joined, and whether they must be lower-case.
#[derive(Clone, Copy)]
pub struct IdRule {
    separator: char,
    lower_only: bool,
}

/// A component id, or one form of a label.
pub const KEBAB: IdRule = IdRule {
    separator: '-',
    lower_only: false,
};
/// The other form of a label.
pub const SNAKE: IdRule = IdRule {
    separator: '_',
    lower_only: false,
};
/// A variable's name.
pub const LOWER_SNAKE: IdRule = IdRule {
    separator: '_',
    lower_only: true,
};

impl IdRule {
    /// Whether `id` is one of this rule's ids; if not, why (in the words Spin's error uses).
    pub fn check(self, id: &str) -> Result<(), String> {
        let IdRule {
            separator,
            lower_only,
        } = self;
        if id.is_empty() {
            return Err("empty".into());
        }
        let other = if separator == '-' { '_' } else { '-' };
        if id.contains(other) {
            return Err(format!(
                "words must be separated with {separator:?}, not {other:?}"
            ));
        }
        for word in id.split(separator) {
            let mut chars = word.chars();
            let Some(first) = chars.next() else {
                return Err(format!("{separator:?}-separated words must not be empty"));
            };
            if !first.is_ascii_alphabetic() {
                return Err(format!(
                    "{separator:?}-separated words must start with an ASCII letter; got {first:?}"
                ));
            }
            let upper = first.is_ascii_uppercase();
            for c in chars {
                if !c.is_ascii_alphanumeric() {
                    return Err(format!(
                        "{separator:?}-separated words may only contain alphanumeric ASCII; got {c:?}"
                    ));
                }
                if c.is_ascii_alphabetic() && c.is_ascii_uppercase() != upper {
                    return Err(format!(
                        "{separator:?}-separated words must be all lowercase or all UPPERCASE; got {word:?}"
                    ));
                }
            }
            if lower_only && upper {
                return Err(format!(
                    "Lower-case identifiers must be all lowercase; got {id:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Whether `label` names a database or a key-value store as Spin accepts it: kebab-case or
/// snake_case.
pub fn check_label(label: &str) -> Result<(), String> {
    KEBAB
        .check(label)
        .or_else(|_| SNAKE.check(label))
        .map_err(|_| format!("label {label:?}: expected kebab-case or snake_case"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_kebab_or_snake_case_words_that_start_with_a_letter() {
        for good in [
            "default", "cell1", "cell12", "cell-one", "cell_one", "my-db2", "MY-DB", "a",
        ] {
            assert_eq!(check_label(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "cell-1",
            "cell_1",
            "1cell",
            "cell--one",
            "-cell",
            "cell-",
            "cell-one_two",
            "Cell",
            "cell.one",
            "b@d",
            "céll",
        ] {
            assert!(check_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn component_ids_are_kebab_case_and_variables_lower_snake_case() {
        assert_eq!(KEBAB.check("dry-run"), Ok(()));
        assert_eq!(KEBAB.check("v2-api"), Ok(()));
        assert!(KEBAB.check("dry_run").is_err());
        assert!(KEBAB.check("api-v-2").is_err());
        assert_eq!(LOWER_SNAKE.check("feed_requests_per_token"), Ok(()));
        assert!(LOWER_SNAKE.check("home_url_2").is_err());
        assert!(LOWER_SNAKE.check("Home_url").is_err());
        assert!(LOWER_SNAKE.check("HOME_URL").is_err());
    }
}
