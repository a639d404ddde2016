//! A statement's result as a backend collects it for the guest: refused as soon as it holds
//! more than [`MAX_RESULT_BYTES`], counted row by row as Spin counts them (each value's size,
//! text and blobs with their bytes), so an oversized result is never buffered whole.

use super::{Error, QueryResult, RowResult, Value};

/// The most bytes of a statement's result the host buffers for the guest, as Spin
/// (`spin_world::MAX_HOST_BUFFERED_BYTES`).
pub const MAX_RESULT_BYTES: usize = 128 << 20;

/// The rows of a result so far, and their size.
pub struct CollectedRows {
    columns: Vec<String>,
    rows: Vec<RowResult>,
    bytes: usize,
}

impl CollectedRows {
    pub fn new(columns: Vec<String>) -> Self {
        CollectedRows {
            columns,
            rows: Vec::new(),
            bytes: std::mem::size_of::<QueryResult>(),
        }
    }

    /// Adds a row, unless the result would then exceed [`MAX_RESULT_BYTES`].
    pub fn push(&mut self, values: Vec<Value>) -> Result<(), Error> {
        self.bytes += values.iter().map(memory_size).sum::<usize>();
        if self.bytes > MAX_RESULT_BYTES {
            return Err(Error::Io(format!(
                "query result exceeds limit of {MAX_RESULT_BYTES} bytes"
            )));
        }
        self.rows.push(RowResult { values });
        Ok(())
    }

    pub fn finish(self) -> QueryResult {
        QueryResult {
            columns: self.columns,
            rows: self.rows,
        }
    }
}

fn memory_size(value: &Value) -> usize {
    std::mem::size_of::<Value>()
        + match value {
            Value::Text(text) => text.len(),
            Value::Blob(blob) => blob.len(),
            Value::Null | Value::Integer(_) | Value::Real(_) => 0,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_refused_once_the_result_would_exceed_the_limit() {
        let mut rows = CollectedRows::new(vec!["blob".into()]);
        let half = MAX_RESULT_BYTES / 2;
        rows.push(vec![Value::Blob(vec![0; half])])
            .expect("half fits");
        let refused = rows.push(vec![Value::Blob(vec![0; half])]).unwrap_err();
        assert!(matches!(refused, Error::Io(message) if message.contains("exceeds limit")));
        assert_eq!(rows.finish().rows.len(), 1);
    }
}
