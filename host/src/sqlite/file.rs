//! A local SQLite file through rusqlite: opening a connection the way Spin does, and running
//! one statement. Both local backends use these.

use std::path::Path;
use std::time::Duration;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, Statement};

use super::result::CollectedRows;
use super::{Error, QueryResult, Value};

/// How long a statement waits for a lock another connection holds before it fails with
/// `database is locked`: Spin's (rusqlite's default), unless the guest sets its own.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a connection as Spin opens one: SQLite's own busy handling with [`BUSY_TIMEOUT`],
/// no pragmas of the host's, and `ATTACH` of a file refused.
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    refuse_attach(&mut conn)?;
    Ok(conn)
}

/// Refuses `ATTACH` of a database file, as Spin does unless a runtime config allows it: a
/// guest must not reach files outside its databases. A temporary (`''`) or in-memory
/// (`':memory:'`) database may still be attached. The guest sees `io("not authorized")`.
pub fn refuse_attach(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.authorizer(Some(|context: AuthContext<'_>| match context.action {
        AuthAction::Attach { filename } if !matches!(filename, "" | ":memory:") => {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }))
}

/// A SQLite error as the guest sees it.
pub fn io_error(e: rusqlite::Error) -> Error {
    Error::Io(e.to_string())
}

/// Runs one statement with positional parameters, through the connection's statement cache.
pub fn run(conn: &Connection, statement: &str, parameters: &[Value]) -> Result<QueryResult, Error> {
    let mut stmt = conn.prepare_cached(statement).map_err(io_error)?;
    query(&mut stmt, parameters).map_err(QueryError::into_guest)
}

/// Why a statement gave no result: SQLite's error, or a result over Spin's limit.
#[derive(Debug)]
pub enum QueryError {
    Sqlite(rusqlite::Error),
    TooLarge(Error),
}

impl From<rusqlite::Error> for QueryError {
    fn from(e: rusqlite::Error) -> Self {
        QueryError::Sqlite(e)
    }
}

impl QueryError {
    /// The error as the guest sees it.
    pub fn into_guest(self) -> Error {
        match self {
            QueryError::Sqlite(e) => io_error(e),
            QueryError::TooLarge(e) => e,
        }
    }
}

/// A guest value bound without copying it.
struct Param<'a>(&'a Value);

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(r) => ValueRef::Real(*r),
            Value::Text(t) => ValueRef::Text(t.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
            Value::Null => ValueRef::Null,
        }))
    }
}

/// Runs a prepared statement and collects its rows, up to Spin's limit.
pub fn query(stmt: &mut Statement<'_>, parameters: &[Value]) -> Result<QueryResult, QueryError> {
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let count = columns.len();
    let mut rows = stmt.query(rusqlite::params_from_iter(parameters.iter().map(Param)))?;
    let mut out = CollectedRows::new(columns);
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(count);
        for i in 0..count {
            values.push(match row.get_ref(i)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(i) => Value::Integer(i),
                ValueRef::Real(r) => Value::Real(r),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => Value::Blob(b.to_vec()),
            });
        }
        out.push(values).map_err(QueryError::TooLarge)?;
    }
    Ok(out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::test_support::temp_db;

    #[test]
    fn runs_statements_with_all_value_types() {
        let conn = open(&temp_db("types")).unwrap();
        run(
            &conn,
            "CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB, n)",
            &[],
        )
        .unwrap();
        let inserted = run(
            &conn,
            "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
            &[
                Value::Integer(-7),
                Value::Real(1.5),
                Value::Text("héllo".into()),
                Value::Blob(vec![0, 255, 1]),
                Value::Null,
            ],
        )
        .unwrap();
        assert!(inserted.columns.is_empty() && inserted.rows.is_empty());
        let q = run(&conn, "SELECT i, r, s, b, n FROM t", &[]).unwrap();
        assert_eq!(q.columns, vec!["i", "r", "s", "b", "n"]);
        assert_eq!(q.rows.len(), 1);
        let v = &q.rows[0].values;
        assert!(matches!(v[0], Value::Integer(-7)));
        assert!(matches!(v[1], Value::Real(r) if r == 1.5));
        assert!(matches!(&v[2], Value::Text(s) if s == "héllo"));
        assert!(matches!(&v[3], Value::Blob(b) if b == &[0, 255, 1]));
        assert!(matches!(v[4], Value::Null));
    }

    #[test]
    fn errors_carry_sqlite_messages() {
        let conn = open(&temp_db("errors")).unwrap();
        match run(&conn, "SELECT * FROM missing", &[]) {
            Err(Error::Io(m)) => assert!(m.contains("no such table"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn attaching_a_file_is_not_authorized_but_memory_is() {
        let db = temp_db("attach");
        let other = db.with_file_name("other.sqlite");
        let conn = open(&db).unwrap();
        let attach = format!("ATTACH DATABASE '{}' AS other", other.display());
        match run(&conn, &attach, &[]) {
            Err(Error::Io(m)) => assert_eq!(m, "not authorized"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(!other.exists(), "the refused ATTACH created no file");
        run(&conn, "ATTACH DATABASE ':memory:' AS scratch", &[]).unwrap();
        run(&conn, "ATTACH DATABASE '' AS temporary", &[]).unwrap();
    }

    #[test]
    fn waits_for_a_lock_as_spin_does() {
        let conn = open(&temp_db("busy")).unwrap();
        let ms: i64 = conn
            .pragma_query_value(None, "busy_timeout", |row| row.get(0))
            .unwrap();
        assert_eq!(ms, BUSY_TIMEOUT.as_millis() as i64);
    }
}
