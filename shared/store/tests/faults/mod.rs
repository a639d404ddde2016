//! A database connection that fails on purpose, the way libSQL and a network fail, for the
//! store's retry paths: errors arrive as message text, as they do through Spin's `io(string)`.

use std::cell::{Cell, RefCell};
use std::path::Path;

use reservations_store::native::NativeDb;
use reservations_store::{Sql, SqlRows, SqlValue, StorageError};

enum Fault {
    /// The next statement starting with `prefix` fails without running.
    Next { prefix: String, message: String },
    /// The server dropped the open transaction before the next statement starting with
    /// `prefix`, which then fails like libSQL's: "Transaction timed out".
    DropTransaction { prefix: String },
}

pub struct Faulty {
    db: NativeDb,
    faults: RefCell<Vec<Fault>>,
    always: RefCell<Option<String>>,
    injected: Cell<usize>,
}

impl Faulty {
    pub fn open(path: impl AsRef<Path>) -> Faulty {
        Faulty {
            db: NativeDb::open(path).unwrap(),
            faults: RefCell::new(Vec::new()),
            always: RefCell::new(None),
            injected: Cell::new(0),
        }
    }

    pub fn fail_next(&self, prefix: &str, message: &str) {
        self.faults.borrow_mut().push(Fault::Next {
            prefix: prefix.into(),
            message: message.into(),
        });
    }

    pub fn drop_transaction_at_next(&self, prefix: &str) {
        self.faults.borrow_mut().push(Fault::DropTransaction {
            prefix: prefix.into(),
        });
    }

    pub fn fail_always(&self, message: &str) {
        *self.always.borrow_mut() = Some(message.into());
    }

    pub fn heal(&self) {
        *self.always.borrow_mut() = None;
    }

    /// How many statements failed on purpose.
    pub fn injected(&self) -> usize {
        self.injected.get()
    }

    pub fn count(&self, table: &str) -> i64 {
        self.db
            .connection()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    fn fail(&self, message: &str) -> Result<SqlRows, StorageError> {
        self.injected.set(self.injected.get() + 1);
        Err(StorageError::from_sqlite_message(message.to_owned()))
    }
}

impl Sql for Faulty {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        if let Some(message) = self.always.borrow().clone() {
            return self.fail(&message);
        }
        let position = self.faults.borrow().iter().position(|fault| match fault {
            Fault::Next { prefix, .. } | Fault::DropTransaction { prefix } => {
                statement.trim_start().starts_with(prefix.as_str())
            }
        });
        if let Some(position) = position {
            match self.faults.borrow_mut().remove(position) {
                Fault::Next { message, .. } => return self.fail(&message),
                Fault::DropTransaction { .. } => {
                    let _ = self.db.execute("ROLLBACK", &[]);
                    return self.fail("Transaction timed out");
                }
            }
        }
        self.db.execute(statement, params)
    }
}
