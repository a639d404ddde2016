//! What an SQL statement is, from its leading words: a read, a write, where a transaction
//! begins or ends. Text only; the database itself says more (SQLite's `sqlite3_stmt_readonly`).
//! The store runs a read again after a transient failure and the host counts the statements
//! under the write lock by the same answer.

/// The kinds of statement told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `SELECT`, `VALUES`, or a `WITH` that changes nothing: a read.
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
    /// `INSERT`, `UPDATE`, `DELETE`, `REPLACE` (also after a `WITH`), and schema changes.
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
    if is_any(first, &["select", "values"]) {
        return Kind::Query;
    }
    if is(first, "with") {
        // A common table expression before a write: any of the write verbs as a word makes
        // it one (a column so named too, which errs on the side of a write).
        let writes = statement
            .split(|c: char| !c.is_ascii_alphabetic())
            .any(|word| is_any(word, &["insert", "update", "delete", "replace"]));
        return if writes { Kind::Write } else { Kind::Query };
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
        for write in [
            "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x",
            "with recent(id) as (select 1) delete from t where id in recent",
            "WITH x AS (SELECT 1) UPDATE t SET y = 2",
        ] {
            assert_eq!(classify(write), Kind::Write, "{write:?}");
        }
    }
}
