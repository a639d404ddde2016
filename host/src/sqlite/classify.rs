//! What a statement is ([`sql_kind`], the same answer the store gets): enough for the binding
//! to follow transactions (to count statements run under the write lock) and for the tuned
//! scheduler to pick where a statement runs. The tuned scheduler still asks SQLite whether a
//! statement it runs inline is read-only.

pub use sql_kind::{Kind, classify};

/// Whether a statement may set the journal mode (then the tuned scheduler looks again).
pub fn sets_journal_mode(statement: &str) -> bool {
    let lower = statement.to_ascii_lowercase();
    lower.trim_start().starts_with("pragma") && lower.contains("journal_mode")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_mode_changes_are_noticed() {
        assert!(sets_journal_mode("PRAGMA journal_mode = WAL"));
        assert!(!sets_journal_mode("PRAGMA user_version"));
    }
}
