//! Reading typed values out of result rows, and small SQL helpers.

use reservations_domain::Timestamp;
use reservations_domain::storage::{Sql, SqlRows, SqlValue, StorageError};
use reservations_domain::time::from_millis;

pub(crate) struct Row<'r>(pub &'r [SqlValue]);

fn wrong_type(i: usize, want: &str, got: &SqlValue) -> StorageError {
    StorageError::Other(format!("column {i}: expected {want}, found {got:?}"))
}

impl Row<'_> {
    pub fn text(&self, i: usize) -> Result<String, StorageError> {
        match &self.0[i] {
            SqlValue::Text(s) => Ok(s.clone()),
            other => Err(wrong_type(i, "text", other)),
        }
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, StorageError> {
        match &self.0[i] {
            SqlValue::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    pub fn int(&self, i: usize) -> Result<i64, StorageError> {
        match &self.0[i] {
            SqlValue::Integer(n) => Ok(*n),
            other => Err(wrong_type(i, "integer", other)),
        }
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, StorageError> {
        match &self.0[i] {
            SqlValue::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    pub fn bool(&self, i: usize) -> Result<bool, StorageError> {
        self.int(i).map(|n| n != 0)
    }

    pub fn time(&self, i: usize) -> Result<Timestamp, StorageError> {
        self.int(i).map(from_millis)
    }

    pub fn opt_time(&self, i: usize) -> Result<Option<Timestamp>, StorageError> {
        Ok(self.opt_int(i)?.map(from_millis))
    }

    /// A JSON array of strings, as org lists are stored.
    pub fn string_list(&self, i: usize) -> Result<Vec<String>, StorageError> {
        let text = self.text(i)?;
        serde_json::from_str(&text)
            .map_err(|e| StorageError::Other(format!("column {i}: bad JSON list: {e}")))
    }

    pub fn opt_string_list(&self, i: usize) -> Result<Option<Vec<String>>, StorageError> {
        match &self.0[i] {
            SqlValue::Null => Ok(None),
            _ => self.string_list(i).map(Some),
        }
    }
}

pub(crate) fn rows(result: &SqlRows) -> impl Iterator<Item = Row<'_>> {
    result.rows.iter().map(|r| Row(r))
}

pub(crate) fn json_list(items: &[String]) -> SqlValue {
    SqlValue::Text(serde_json::to_string(items).expect("a list of strings serializes"))
}

pub(crate) fn millis(t: Timestamp) -> SqlValue {
    SqlValue::Integer(t.timestamp_millis())
}

/// `?, ?, ?` for `n` parameters.
pub(crate) fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// Runs a statement once per chunk of `items`, for `IN (…)` lists and multi-row inserts
/// bigger than SQLite's parameter limit.
pub(crate) fn for_chunks<T>(
    items: &[T],
    per_item: usize,
    mut run: impl FnMut(&[T]) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    const MAX_PARAMS: usize = 30_000;
    let chunk = (MAX_PARAMS / per_item.max(1)).max(1);
    for part in items.chunks(chunk) {
        run(part)?;
    }
    Ok(())
}

pub(crate) fn exec(db: &dyn Sql, sql: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
    db.execute(sql, params)
}
