//! Reading typed values out of result rows by column name, and small SQL helpers.

use reservations_domain::Timestamp;
use reservations_domain::time::from_millis;
use serde::de::DeserializeOwned;

use crate::storage::{Sql, SqlRows, SqlValue, StorageError};

/// One row of a result, read by the names its statement gives its columns.
pub(crate) struct Row<'r> {
    columns: &'r [String],
    values: &'r [SqlValue],
}

fn wrong_type(column: &str, want: &str, got: &SqlValue) -> StorageError {
    StorageError::Other(format!("column {column}: expected {want}, found {got:?}").into())
}

impl<'r> Row<'r> {
    /// The value of a column; an error names a column the statement does not return. Names
    /// match as SQL's do, whatever their case: sqld spells an alias that is also a keyword
    /// (`AS action`) in capitals.
    pub fn value(&self, column: &str) -> Result<&'r SqlValue, StorageError> {
        self.columns
            .iter()
            .position(|name| name.eq_ignore_ascii_case(column))
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| {
                StorageError::Other(
                    format!(
                        "no column {column} in the result (columns: {})",
                        self.columns.join(", ")
                    )
                    .into(),
                )
            })
    }

    pub fn text(&self, column: &str) -> Result<String, StorageError> {
        match self.value(column)? {
            SqlValue::Text(s) => Ok(s.clone()),
            other => Err(wrong_type(column, "text", other)),
        }
    }

    pub fn opt_text(&self, column: &str) -> Result<Option<String>, StorageError> {
        match self.value(column)? {
            SqlValue::Null => Ok(None),
            _ => self.text(column).map(Some),
        }
    }

    pub fn int(&self, column: &str) -> Result<i64, StorageError> {
        match self.value(column)? {
            SqlValue::Integer(n) => Ok(*n),
            other => Err(wrong_type(column, "integer", other)),
        }
    }

    pub fn opt_int(&self, column: &str) -> Result<Option<i64>, StorageError> {
        match self.value(column)? {
            SqlValue::Null => Ok(None),
            _ => self.int(column).map(Some),
        }
    }

    pub fn bool(&self, column: &str) -> Result<bool, StorageError> {
        self.int(column).map(|n| n != 0)
    }

    pub fn time(&self, column: &str) -> Result<Timestamp, StorageError> {
        self.int(column).map(from_millis)
    }

    pub fn opt_time(&self, column: &str) -> Result<Option<Timestamp>, StorageError> {
        Ok(self.opt_int(column)?.map(from_millis))
    }

    /// A JSON text column (org lists, and what statements aggregate with `json_group_array`).
    pub fn json<T: DeserializeOwned>(&self, column: &str) -> Result<T, StorageError> {
        let text = self.text(column)?;
        serde_json::from_str(&text)
            .map_err(|e| StorageError::Other(format!("column {column}: bad JSON: {e}").into()))
    }

    pub fn opt_json<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>, StorageError> {
        match self.value(column)? {
            SqlValue::Null => Ok(None),
            _ => self.json(column).map(Some),
        }
    }

    /// A JSON array of strings, as org lists are stored.
    pub fn string_list(&self, column: &str) -> Result<Vec<String>, StorageError> {
        self.json(column)
    }

    /// A stored name parsed into its type; `what` names the type in the error.
    pub fn parsed<T>(
        &self,
        column: &str,
        what: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, StorageError> {
        let name = self.text(column)?;
        parse(&name).ok_or_else(|| {
            StorageError::Other(format!("column {column}: unknown {what} {name:?}").into())
        })
    }
}

pub(crate) fn rows(result: &SqlRows) -> impl Iterator<Item = Row<'_>> {
    result.rows.iter().map(|values| Row {
        columns: &result.columns,
        values,
    })
}

/// The first row of a result, if any.
pub(crate) fn first_row(result: &SqlRows) -> Option<Row<'_>> {
    rows(result).next()
}

pub(crate) fn json_list(items: &[String]) -> SqlValue {
    SqlValue::Text(serde_json::to_string(items).expect("a list of strings serializes"))
}

pub(crate) fn millis(t: Timestamp) -> SqlValue {
    SqlValue::Integer(t.timestamp_millis())
}

/// Parameters are borrowed from many places; this keeps call sites short.
pub(crate) fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.to_owned())
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

pub(crate) fn exec(db: &dyn Sql, sql: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
    db.execute(sql, params)
}

/// Reads a listing's row with `read`; a row it cannot read is an [`crate::UnreadableRow`]
/// named by its `key_column` (as text, whatever it holds).
pub(crate) fn read_listed<T>(
    row: &Row<'_>,
    key_column: &str,
    read: impl FnOnce(&Row<'_>) -> Result<T, StorageError>,
) -> Result<T, crate::UnreadableRow> {
    read(row).map_err(|e| crate::UnreadableRow {
        key: match row.value(key_column) {
            Ok(SqlValue::Text(key)) => key.clone(),
            Ok(SqlValue::Integer(key)) => key.to_string(),
            Ok(other) => format!("{other:?}"),
            Err(_) => String::new(),
        },
        error: e.to_string(),
    })
}
