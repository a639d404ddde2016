//! The free-text and time values a request carries, each checked once, here, into a type: a
//! value of one of these types has passed its rule.

use std::borrow::Cow;

use crate::Timestamp;
use crate::error::DomainError;
use crate::time::parse_rfc3339;

/// Why a change was made, recorded with it: at most [`Reason::MAX_CHARS`] characters, and no
/// control characters but newline and tab (they would corrupt the logs that show it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    pub const MAX_CHARS: usize = 1024;

    pub fn parse(text: String) -> Result<Reason, DomainError> {
        if text.chars().count() > Reason::MAX_CHARS {
            return Err(invalid(
                "reason",
                format!("may have at most {} characters", Reason::MAX_CHARS),
            ));
        }
        if text
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
        {
            return Err(invalid("reason", "may not contain control characters"));
        }
        Ok(Reason(text))
    }

    /// An optional reason, as a request body carries it.
    pub fn optional(text: Option<String>) -> Result<Option<Reason>, DomainError> {
        text.map(Reason::parse).transpose()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// The caller's reference to the contract behind a reservation: at most
/// [`ContractRef::MAX_CHARS`] characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractRef(String);

impl ContractRef {
    pub const MAX_CHARS: usize = 256;

    pub fn parse(text: String) -> Result<ContractRef, DomainError> {
        if text.chars().count() > ContractRef::MAX_CHARS || text.chars().any(char::is_control) {
            return Err(invalid(
                "contractRef",
                format!(
                    "must be at most {} characters without control characters",
                    ContractRef::MAX_CHARS
                ),
            ));
        }
        Ok(ContractRef(text))
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// The display name of an org or a key: 1 to [`Name::MAX_CHARS`] characters, no control
/// characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(String);

impl Name {
    pub const MAX_CHARS: usize = 200;

    pub fn parse(text: String) -> Result<Name, DomainError> {
        let length = text.chars().count();
        if length == 0 || length > Name::MAX_CHARS || text.chars().any(char::is_control) {
            return Err(invalid(
                "name",
                format!(
                    "must be 1-{} characters without control characters",
                    Name::MAX_CHARS
                ),
            ));
        }
        Ok(Name(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An instant as the API writes it, RFC 3339 with any offset, kept to the millisecond the
/// store keeps ([`parse_rfc3339`]); `field` names it in the refusal.
pub fn instant(field: &'static str, text: &str) -> Result<Timestamp, DomainError> {
    parse_rfc3339(text)
        .ok_or_else(|| invalid(field, "must be an RFC 3339 time, e.g. 2026-01-31T12:00:00Z"))
}

fn invalid(field: &'static str, message: impl Into<Cow<'static, str>>) -> DomainError {
    DomainError::invalid(field, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_bounded_and_free_of_control_characters() {
        assert!(Reason::parse("x".repeat(Reason::MAX_CHARS)).is_ok());
        assert!(Reason::parse("x".repeat(Reason::MAX_CHARS + 1)).is_err());
        assert!(Reason::parse("two\nlines\tand a tab".into()).is_ok());
        assert!(Reason::parse("a bell \u{7}".into()).is_err());
        assert_eq!(Reason::optional(None), Ok(None));
    }

    #[test]
    fn a_contract_ref_is_bounded_and_free_of_control_characters() {
        assert!(ContractRef::parse("c".repeat(ContractRef::MAX_CHARS)).is_ok());
        assert!(ContractRef::parse("c".repeat(ContractRef::MAX_CHARS + 1)).is_err());
        assert!(ContractRef::parse("line\nbreak".into()).is_err());
    }

    #[test]
    fn a_name_is_one_to_two_hundred_characters_without_control_characters() {
        assert!(Name::parse("n".repeat(Name::MAX_CHARS)).is_ok());
        assert!(Name::parse("n".repeat(Name::MAX_CHARS + 1)).is_err());
        assert!(Name::parse(String::new()).is_err());
        assert!(Name::parse("tab\there".into()).is_err());
    }

    #[test]
    fn an_instant_is_rfc_3339_kept_to_the_millisecond() {
        let at = instant("startsAt", "2026-01-31T12:00:00.0009+01:00").expect("parses");
        assert_eq!(at.to_rfc3339(), "2026-01-31T11:00:00+00:00");
        let refused = instant("startsAt", "tomorrow").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "startsAt: must be an RFC 3339 time, e.g. 2026-01-31T12:00:00Z"
        );
    }
}
