//! Statements counted as the guests run them: per request and for the whole host, split into
//! those run while the connection had a write transaction open (which hold the database's
//! write lock, so they bound write throughput: one writer at a time).

use std::sync::atomic::{AtomicU64, Ordering};

/// How many statements ran, and how many of them under the write lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatementCounts {
    pub statements: u64,
    /// Statements run while the connection's write transaction was open, from its
    /// `BEGIN IMMEDIATE` (or a deferred transaction's first write) to its `COMMIT` or
    /// `ROLLBACK`, both included.
    pub in_write_transaction: u64,
}

impl std::ops::Add for StatementCounts {
    type Output = StatementCounts;

    fn add(self, other: StatementCounts) -> StatementCounts {
        StatementCounts {
            statements: self.statements + other.statements,
            in_write_transaction: self.in_write_transaction + other.in_write_transaction,
        }
    }
}

impl std::ops::Sub for StatementCounts {
    type Output = StatementCounts;

    fn sub(self, earlier: StatementCounts) -> StatementCounts {
        StatementCounts {
            statements: self.statements - earlier.statements,
            in_write_transaction: self.in_write_transaction - earlier.in_write_transaction,
        }
    }
}

/// A running count, shared by whoever records into it.
#[derive(Debug, Default)]
pub struct StatementCounter {
    statements: AtomicU64,
    in_write_transaction: AtomicU64,
    /// Statements by the label of the database they ran on.
    by_label: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl StatementCounter {
    pub fn record(&self, label: &str, in_write_transaction: bool) {
        self.statements.fetch_add(1, Ordering::Relaxed);
        if in_write_transaction {
            self.in_write_transaction.fetch_add(1, Ordering::Relaxed);
        }
        let mut by_label = self.by_label.lock().unwrap_or_else(|e| e.into_inner());
        *by_label.entry(label.to_owned()).or_default() += 1;
    }

    /// How many statements ran on the database labelled `label`.
    pub fn of_label(&self, label: &str) -> u64 {
        let by_label = self.by_label.lock().unwrap_or_else(|e| e.into_inner());
        by_label.get(label).copied().unwrap_or(0)
    }

    pub fn get(&self) -> StatementCounts {
        StatementCounts {
            statements: self.statements.load(Ordering::Relaxed),
            in_write_transaction: self.in_write_transaction.load(Ordering::Relaxed),
        }
    }
}
