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
}

impl StatementCounter {
    pub fn record(&self, in_write_transaction: bool) {
        self.statements.fetch_add(1, Ordering::Relaxed);
        if in_write_transaction {
            self.in_write_transaction.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> StatementCounts {
        StatementCounts {
            statements: self.statements.load(Ordering::Relaxed),
            in_write_transaction: self.in_write_transaction.load(Ordering::Relaxed),
        }
    }
}
