//! What a statement is, from its first words: enough for the binding to follow transactions
//! (to count statements run under the write lock) and for the tuned scheduler to pick where
//! a statement runs. Text only; the tuned scheduler still asks SQLite whether a statement
//! it runs inline is read-only.

/// The kinds of statement the host tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `SELECT`, `WITH`, `VALUES`: usually a read (a `WITH … INSERT` is not).
    Query,
    /// `BEGIN [DEFERRED] [TRANSACTION]`: takes no lock until the first read or write.
    BeginDeferred,
    /// `BEGIN IMMEDIATE` / `BEGIN EXCLUSIVE`: takes the write lock at once.
    BeginWrite,
    /// `COMMIT`, `END`, `ROLLBACK` (with an optional `TRANSACTION`): ends the transaction.
    End,
    /// `PRAGMA busy_timeout` / `user_version` / `schema_version`: connection state or a
    /// header field.
    ConnectionPragma,
    /// `INSERT`, `UPDATE`, `DELETE`, `REPLACE`, and schema changes.
    Write,
    /// Anything else (other pragmas, `SAVEPOINT`, `VACUUM`, …).
    Other,
}

/// Classifies a statement by its leading keywords.
pub fn classify(statement: &str) -> Kind {
    let mut words = statement
        .trim_start()
        .split(|c: char| c.is_ascii_whitespace() || c == ';' || c == '(')
        .filter(|w| !w.is_empty());
    let Some(first) = words.next() else {
        return Kind::Other;
    };
    let is = |word: &str, keyword: &str| word.eq_ignore_ascii_case(keyword);
    let is_any = |word: &str, keywords: &[&str]| keywords.iter().any(|k| is(word, k));
    if is_any(first, &["select", "with", "values"]) {
        return Kind::Query;
    }
    if is(first, "begin") {
        return match words.next() {
            None => Kind::BeginDeferred,
            Some(w) if is_any(w, &["deferred", "transaction"]) => Kind::BeginDeferred,
            Some(w) if is_any(w, &["immediate", "exclusive"]) => Kind::BeginWrite,
            Some(_) => Kind::Other,
        };
    }
    if is_any(first, &["commit", "end", "rollback"]) {
        return if words.all(|w| is(w, "transaction")) {
            Kind::End
        } else {
            // `ROLLBACK TO <savepoint>` keeps the transaction.
            Kind::Other
        };
    }
    if is(first, "pragma") {
        let name = words.next().unwrap_or("");
        let name = name.split('=').next().unwrap_or("");
        let name = name.strip_prefix("main.").unwrap_or(name);
        return if is_any(name, &["busy_timeout", "user_version", "schema_version"]) {
            Kind::ConnectionPragma
        } else {
            Kind::Other
        };
    }
    if is_any(
        first,
        &[
            "insert", "update", "delete", "replace", "create", "drop", "alter",
        ],
    ) {
        return Kind::Write;
    }
    Kind::Other
}

/// Whether a statement may set the journal mode (then the tuned scheduler looks again).
pub fn sets_journal_mode(statement: &str) -> bool {
    let lower = statement.to_ascii_lowercase();
    lower.trim_start().starts_with("pragma") && lower.contains("journal_mode")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_are_recognised() {
        for yes in [
            "BEGIN IMMEDIATE",
            "begin immediate transaction",
            "  BEGIN\n EXCLUSIVE;",
            "Begin Immediate;",
        ] {
            assert_eq!(classify(yes), Kind::BeginWrite, "{yes:?}");
        }
        for deferred in ["BEGIN", "BEGIN DEFERRED", "BEGIN TRANSACTION", "begin;"] {
            assert_eq!(classify(deferred), Kind::BeginDeferred, "{deferred:?}");
        }
        for end in ["COMMIT", "END TRANSACTION", "rollback", "COMMIT;"] {
            assert_eq!(classify(end), Kind::End, "{end:?}");
        }
        for other in [
            "SELECT 'BEGIN IMMEDIATE'",
            "BEGINIMMEDIATE",
            "",
            "ROLLBACK TO a",
        ] {
            assert_ne!(classify(other), Kind::BeginWrite, "{other:?}");
            assert_ne!(classify(other), Kind::End, "{other:?}");
        }
    }

    #[test]
    fn reads_writes_and_pragmas() {
        for query in [
            "SELECT 1",
            "  select * from t",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1)",
        ] {
            assert_eq!(classify(query), Kind::Query, "{query:?}");
        }
        for write in [
            "INSERT INTO t VALUES (1)",
            "update t set x = 1",
            "DELETE FROM t",
            "REPLACE INTO t VALUES (1)",
            "CREATE TABLE t (x)",
        ] {
            assert_eq!(classify(write), Kind::Write, "{write:?}");
        }
        for pragma in [
            "PRAGMA busy_timeout = 5000",
            "PRAGMA user_version",
            "pragma main.schema_version",
        ] {
            assert_eq!(classify(pragma), Kind::ConnectionPragma, "{pragma:?}");
        }
        for other in [
            "PRAGMA journal_mode = WAL",
            "PRAGMA wal_checkpoint",
            "VACUUM",
            "SAVEPOINT a",
        ] {
            assert_eq!(classify(other), Kind::Other, "{other:?}");
        }
        assert!(sets_journal_mode("PRAGMA journal_mode = WAL"));
        assert!(!sets_journal_mode("PRAGMA user_version"));
    }
}
